"""Pull and the decommission gate, as the headless verbs and the TUI both run them.

The gate passes only when the run is done or stopped, the node's `verify` passes, and every
artifact of the pull set is here with a matching sha256; otherwise it lists what is missing.
A node of a generation campaign must also hold no chunk of the queue: then it can go back
while the campaign's other nodes still run, and its agent records that in the campaign's
prefix (`nodes/NODE/given-back.json`), where every console sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agents.rpc.protocol import RpcError
from agents.rundir.schema import ManifestEntry
from console.artifacts.pull import PULL_CIPHERS, PullProgress, PullReport, local_sha256, puller_for
from console.artifacts.pullset import (
    confined,
    dest_for,
    fetch_manifest,
    pull_lock,
    pull_set,
    safe_rel,
    save_manifest,
)
from console.artifacts.sources import (
    OpensshSource,
    PullError,
    Source,
    choose_data_path,
    open_source,
)
from console.fleet import Campaign, Fleet, Node
from console.headless import (
    EXIT_CHECK,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    open_link,
    say,
)
from console.sanitize import shown
from console.transport import AgentLink, Unreachable


@dataclass
class Item:
    name: str
    ok: bool
    detail: str
    missing: list[str] = field(default_factory=list)


@dataclass
class Checklist:
    node: str
    dest: str
    items: list[Item]

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.items)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "dest": self.dest, "ok": self.ok,
                "items": [asdict(i) for i in self.items]}


async def _context(link: AgentLink, node: Node, everything: bool
                   ) -> tuple[dict[str, Any], list[ManifestEntry], list[ManifestEntry]]:
    """The node's status, its whole manifest, and the pull set chosen from it."""
    snap = await link.call("status", {}, timeout=60)
    if not isinstance(snap, dict):
        raise PullError(f"{shown(node.name)}: the node's status answer is "
                        f"{shown(repr(snap)[:80])}, not a snapshot; refused")
    entries = await fetch_manifest(link.call)
    chosen = pull_set(entries, node.role, everything, snap.get("train"))
    return snap, entries, chosen


class LinkFailed(Exception):
    """pull_node could not connect the link it was asked to connect (the cause is chained)."""


async def pull_node(link: AgentLink, node: Node, pull_dir: Path, everything: bool = False,
                    on_progress: Callable[[PullProgress], None] | None = None,
                    data_path: str | None = None, connect: bool = False) -> PullReport:
    """Pull the node's pull set; `data_path` picks one (console/artifacts/sources.py).
    `connect`: the link is connected here, after the stream's ssh logins have begun, so the
    two overlap (LinkFailed when it cannot be); else it is connected already."""
    source: Source | None = None
    try:
        if connect:
            if not node.local and choose_data_path(data_path) == "stream":
                source = await open_source(node, None, data_path)
                assert isinstance(source, OpensshSource)
                source.prestart()
            try:
                await link.connect()
            except (Unreachable, OSError) as exc:
                raise LinkFailed(str(exc)) from exc
            if isinstance(source, OpensshSource):
                source.conn = link.conn  # for the names only SFTP can fetch
        if source is None:
            source = await open_source(node, link.conn, data_path)
            if isinstance(source, OpensshSource):
                source.prestart()  # its logins overlap the status and manifest calls
        snap, entries, chosen = await _context(link, node, everything)
        dest = dest_for(pull_dir, node, snap.get("run"))
        with pull_lock(dest):  # refused while another pull writes here
            save_manifest(dest, entries)
            report = await puller_for(source, dest, on_progress, node.pull_stall_s).run(chosen)
    finally:
        if source is not None:
            await source.close()
    report.refused = [e.path for e in entries if e.refused is not None]
    return report


def generation_campaign(fleet: Fleet, node: str) -> Campaign | None:
    """The generation campaign `node` takes work for, whose items the checklist adds (no
    chunk it took left without a commit); None for any other node."""
    campaign = fleet.campaign_of(node)
    if campaign is None or fleet.campaign_role(campaign) != "generate":
        return None
    return campaign


async def checklist(link: AgentLink, node: Node, pull_dir: Path,
                    campaign: Campaign | None = None, proof_dir: Path | None = None
                    ) -> Checklist:
    """The checklist against the copy in `pull_dir`. A campaign node that passes writes its
    given-back record into the campaign's prefix (through its agent), which any console
    reads; `proof_dir` is unused and kept for callers."""
    snap, entries, chosen = await _context(link, node, False)
    dest = dest_for(pull_dir, node, snap.get("run"))
    status = snap.get("status")
    items = [Item("run finished", status in ("done", "stopped"),
                  f"run {shown(snap['run'])} is {shown(status)}")]
    if node.role == "generate":
        try:
            report = await link.call("verify", {}, timeout=3600)
            problems = [shown(p) for p in report.get("problems") or []]
            items.append(Item("verify (S3 and counts)", bool(report.get("ok")),
                              verify_summary(report) if report.get("ok")
                              else "; ".join(problems[:5]), problems))
        except RpcError as exc:
            items.append(Item("verify (S3 and counts)", False, shown(exc.message)))
        if campaign is not None:
            items += await campaign_items(link, node, campaign, snap)
    missing = []
    for e in chosen:
        try:
            rel = safe_rel(e.path)
            here = confined(dest, rel)
        except PullError:
            missing.append(f"{shown(e.path)} (refused: it would land outside {shown(str(dest))})")
            continue
        got = await asyncio.to_thread(local_sha256, here, e.size)
        if got != e.sha256:
            missing.append(shown(rel) + (" (differs)" if here.exists() else ""))
    refused = [f"{shown(e.path)} ({e.refused})" for e in entries if e.refused is not None]
    items.append(Item("nothing refused", not refused,
                      "every file in the run directory can be served" if not refused else
                      f"{len(refused)} file(s) the agent will not serve (a symlink, or "
                      "unreadable): copy them by hand or remove them", refused))
    detail = (f"all {len(chosen)} files here with matching sha256 in {dest}" if not missing
              else f"{len(missing)} of {len(chosen)} missing or different in "
              f"{shown(str(dest))}")
    if any(m.startswith("logs/") for m in missing) and snap.get("source") == "supervisor" \
            and any(isinstance(s, dict) and s.get("state") == "healthy"
                    for s in snap.get("servers") or []):
        # Advice, not a file: it is said beside the count, never counted.
        detail += ("; the servers are still up and their logs keep growing: `down` first, "
                   "then pull again")
    items.append(Item("artifacts pulled", not missing, detail, missing))
    result = Checklist(node.name, str(dest), items)
    if campaign is not None and result.ok:
        try:
            await link.call("queue_give_back", {}, timeout=120)
            result.items.append(Item("given back in the queue", True,
                                     f"recorded in campaign {shown(campaign.name)}'s prefix: "
                                     "every console sees the node as given back"))
        except RpcError as exc:
            result.items.append(Item("given back in the queue", False, shown(exc.message)))
    return result


async def campaign_items(link: AgentLink, node: Node, campaign: Campaign,
                         snap: dict[str, Any]) -> list[Item]:
    """A campaign node is safe to leave once it holds nothing the campaign still needs: no
    chunk it took is left without a commit (its own, or another node's after a takeover)."""
    progress = snap.get("progress") if isinstance(snap.get("progress"), dict) else None
    queue = (progress or {}).get("queue")
    if not isinstance(queue, dict):
        return [Item("no chunk held", False, "the run reports no queue (not a node of a "
                     "campaign, or never started): nothing says it holds no work")]
    held = [shown(str(h)) for h in queue.get("held") or []]
    if held:
        return [Item("no chunk held", False, f"it holds chunk(s) {', '.join(held)}: let it "
                     "finish, or stop it and let their leases be taken over", held)]
    return [Item("no chunk held", True, f"no chunk held; {queue.get('committed_here', 0)} "
                 f"committed by this node, {queue.get('lost', 0)} lost to another")]


def verify_summary(report: dict[str, Any]) -> str:
    """A passing verify in words: for a live run, that it is live and what is in flight."""
    for check in report.get("checks") or []:
        if isinstance(check, dict) and check.get("name") == "live":
            detail = str(check.get("detail") or "")
            if "judged on what is committed" in detail:
                return shown(detail)
    return "every closed batch in S3, counts agree"


def _printer() -> Callable[[PullProgress], None]:
    last = [0.0]

    def show(p: PullProgress) -> None:
        import time

        now = time.monotonic()
        if now - last[0] < 0.5 and p.files_done < p.files_total:
            return
        last[0] = now
        eta = f"{p.eta_s:.0f} s" if p.eta_s is not None else "?"
        print(f"\r{p.files_done}/{p.files_total} files, {p.bytes_done / 2**20:.1f}/"
              f"{p.bytes_total / 2**20:.1f} MiB, {p.rate / 2**20:.1f} MiB/s, ETA {eta}   ",
              end="", file=sys.stderr, flush=True)

    return show


async def cmd_pull(fleet: Fleet, args: argparse.Namespace) -> int:
    node = fleet.node(args.node_name)
    link = AgentLink(node, ciphers=PULL_CIPHERS)
    try:
        pull_dir = Path(args.to) if args.to else fleet.pull_dir
        report = await pull_node(link, node, pull_dir, args.all, _printer(), connect=True)
    except LinkFailed as exc:
        say(str(exc))
        return EXIT_UNREACHABLE
    except (RpcError, ConnectionError, TimeoutError) as exc:
        say(f"\n{node.name}: pull: {shown(exc)}")
        return EXIT_UNREACHABLE
    except PullError as exc:
        say(f"\n{node.name}: pull: {shown(exc)}")
        return EXIT_USAGE
    finally:
        await link.close()
    print(file=sys.stderr)
    print(json.dumps({"dest": str(report.dest), "copied": len(report.copied),
                      "skipped": len(report.skipped), "resumed": report.resumed,
                      "refetched": report.refetched, "failed": report.failed,
                      "refused": report.refused,
                      "bytes_transferred": report.bytes_transferred,
                      "data_path": report.data_path, "notes": report.notes}))
    for note in report.notes:
        say(f"{node.name}: {shown(note)}")
    for rel, why in report.failed.items():
        say(f"{node.name}: {shown(rel)}: {shown(why)}")
    return EXIT_OK if report.ok else EXIT_CHECK


async def cmd_decommission_check(fleet: Fleet, args: argparse.Namespace) -> int:
    node = fleet.node(args.node_name)
    try:
        link = await open_link(node, args.accept_new_host_key)
    except (Unreachable, OSError) as exc:
        say(str(exc))
        return EXIT_UNREACHABLE
    try:
        pull_dir = Path(args.to) if args.to else fleet.pull_dir
        result = await checklist(link, node, pull_dir, generation_campaign(fleet, node.name),
                                 proof_dir=fleet.pull_dir)
    except (RpcError, ConnectionError, TimeoutError) as exc:
        say(f"{node.name}: decommission-check: {shown(exc)}")
        return EXIT_UNREACHABLE
    except PullError as exc:
        say(f"{node.name}: decommission-check: {shown(exc)}")
        return EXIT_USAGE
    finally:
        await link.close()
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        for item in result.items:
            print(f"[{'x' if item.ok else ' '}] {item.name}: {shown(item.detail)}")
            for m in item.missing[:50]:
                print(f"      - {shown(m)}")
        print("SAFE to give the node back" if result.ok else "NOT safe to give the node back")
    return EXIT_OK if result.ok else EXIT_CHECK


__all__ = ["Checklist", "campaign_items", "checklist", "cmd_decommission_check", "cmd_pull",
           "pull_node"]
