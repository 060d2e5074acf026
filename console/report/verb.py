"""`fleetdeck report NODE|CAMPAIGN|PULLED_DIR --to DIR`: where a report's history comes from.
A node, or each node of a campaign, is read live through its `history` RPC (the run need not
be pulled, and a finished node's agent answers from disk); a folder is read here: a pulled
run directory (`fleetdeck pull` puts it at PULL_DIR/NODE/RUN), a node's pull folder, or a
whole pull dir. The history is read by console/runhistory.py, the one place that knows how."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from agents.rpc.protocol import RpcError
from console.fleet import Fleet, FleetError, Node
from console.headless import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, load, open_link, say
from console.report.render import NoMatplotlib, write
from console.report.series import RunHistory
from console.runhistory import BadHistory, HistoryRead, read_dir, read_link
from console.sanitize import shown
from console.transport import AgentLink, Unreachable


def add(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page of a run's whole history "
                       "(plots and a summary table) and the plots as PNG")
    p.add_argument("target", metavar="NODE|CAMPAIGN|DIR",
                   help="a node or a campaign of the fleet file (read live), or a folder "
                        "here: a pulled run (PULL_DIR/NODE/RUN), a node's pull folder or the "
                        "pull dir")
    p.add_argument("--to", required=True, metavar="DIR",
                   help="where report.html and plots/*.png go (made if missing)")
    p.set_defaults(runner=cmd_report, sync=True)


def _noted(h: RunHistory, info: HistoryRead) -> RunHistory:
    notes = [h.note] if h.note else []
    if info.refused:
        notes.append(f"history not read: {info.refused}")
    if info.cut:
        notes.append("history cut at its first million samples")
    h.note = "; ".join(notes) or None
    h.bad += info.bad_lines  # the reader skipped those; h.bad counts items that did not fit
    h.finish()
    return h


def runs_here(folder: Path) -> list[tuple[str, Path]]:
    """The run directories a folder holds, with their names in the report: the folder itself
    when it holds history.jsonl, else its subfolders that do (NODE), else theirs (NODE/RUN).
    Symlinked folders are not followed."""
    def is_run(p: Path) -> bool:
        return (p / "history.jsonl").is_file() and not p.is_symlink()

    if is_run(folder):
        name = f"{folder.parent.name}/{folder.name}" if folder.parent.name else folder.name
        return [(name, folder)]
    found: list[tuple[str, Path]] = []
    for depth in (1, 2):
        pattern = "*" if depth == 1 else "*/*"
        found = [("/".join(p.relative_to(folder).parts), p) for p in sorted(folder.glob(pattern))
                 if p.is_dir() and not p.is_symlink() and not p.parent.is_symlink()
                 and is_run(p) and not any(x.startswith(".") for x in p.relative_to(folder).parts)]
        if found:
            return found
    return found


def read_local(folder: Path) -> list[RunHistory]:
    runs = []
    for name, path in runs_here(folder):
        info = HistoryRead()
        h = RunHistory(name)
        for page in read_dir(path, info):
            h.add(page)
        runs.append(_noted(h, info))
    return runs


async def read_history(link: AgentLink, name: str, timeout: float = 120.0) -> RunHistory:
    """One node's history over a link that is open; a refusal or a broken answer is a run
    with a note (a campaign's report is written with the nodes that answered)."""
    h = RunHistory(name)
    info = HistoryRead()
    try:
        async for page in read_link(link, name, info, timeout=timeout):
            h.add(page)
    except (RpcError, ConnectionError, TimeoutError, BadHistory) as exc:
        h.note = f"history failed: {getattr(exc, 'message', None) or exc}"
        h.finish()
        return h
    return _noted(h, info)


async def read_node(node: Node, accept_new: bool, timeout: float) -> RunHistory:
    try:
        link = await open_link(node, accept_new)
    except (Unreachable, OSError) as exc:
        return RunHistory(node.name, note=f"unreachable: {exc}")
    try:
        return await read_history(link, node.name, timeout)
    finally:
        await link.close()


async def read_fleet(fleet: Fleet, name: str, accept_new: bool, timeout: float
                     ) -> tuple[list[RunHistory], str | None]:
    if fleet.has_campaign(name):
        campaign = fleet.campaign(name)
        nodes = [fleet.node(n) for n in campaign.nodes]
        runs = await asyncio.gather(*(read_node(n, accept_new, timeout) for n in nodes))
        return list(runs), campaign.name
    return [await read_node(fleet.node(name), accept_new, timeout)], None


def cmd_report(args: argparse.Namespace) -> int:
    target = Path(args.target)
    campaign: str | None = None
    if target.is_dir():
        runs = read_local(target)
        if not runs:
            say(f"fleetdeck report: {target} holds no run directory (a folder with "
                "history.jsonl, as `fleetdeck pull` copies it)")
            return EXIT_USAGE
        source = f"the pulled copy in {target.resolve()}"
        title = f"Run report: {target.resolve().name}"
    else:
        try:
            fleet = load(args)
            runs, campaign = asyncio.run(read_fleet(fleet, args.target,
                                                    args.accept_new_host_key, args.timeout))
        except FleetError as exc:
            say(f"fleetdeck report: {exc} (or give a pulled run's folder)")
            return EXIT_USAGE
        source = f"campaign {campaign} live, through its nodes' history" if campaign else \
            f"node {args.target} live, through its history"
        title = f"Run report: {'campaign ' if campaign else ''}{args.target}"
        if not any(h.samples for h in runs):
            for h in runs:
                say(f"{h.name}: {shown(h.note or 'no history recorded')}")
            if all(h.note and h.note.startswith("unreachable") for h in runs):
                return EXIT_UNREACHABLE
    for h in runs:
        if h.note:
            say(f"{h.name}: {shown(h.note)}")
    try:
        path = write(Path(args.to), title, source, runs, campaign)
    except NoMatplotlib as exc:
        say(f"fleetdeck report: {exc}")
        return EXIT_USAGE
    except OSError as exc:
        say(f"fleetdeck report: cannot write {args.to}: {exc.strerror or exc}")
        return EXIT_USAGE
    print(path, file=sys.stdout)
    return EXIT_OK


def tui_dest(pull_dir: Path, name: str) -> Path:
    """Where the TUI writes a node's or a campaign's report: PULL_DIR/reports/NAME (names are
    one plain folder name, checked when the fleet file loads)."""
    return pull_dir / "reports" / name
