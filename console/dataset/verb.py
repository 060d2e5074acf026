"""`fleetdeck dataset NODE|CAMPAIGN --to DIR [--push REPO_ID]`: on the console, never on the
node (the agent is installed without extras; the node may be gone): a node's run from its
pulled copy (PULL_DIR/NODE/RUN, `pull --all`), a campaign from its S3 prefix or a copy of it,
through its commits. Refused unless the source verifies (console/dataset/source.py). With
--push, a DIR whose data files are still this export's byte for byte (its mark's hashes) is
pushed as it is, not exported again: a push cut short and run again resumes its upload, and
the card the user filled in (and files added, a LICENSE) go up as they are. An export never
replaces those silently: it refuses, naming them, unless --force."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from console.headless import EXIT_CHECK, EXIT_OK, EXIT_USAGE, FleetError, load, say
from console.sanitize import shown


def add(sub: Any) -> None:
    p = sub.add_parser("dataset", help="a verified run's lines as a Hugging Face dataset "
                       "(Parquet + card) in DIR; --push uploads it")
    p.add_argument("node_name", metavar="NODE|CAMPAIGN")
    p.add_argument("--to", required=True, metavar="DIR", help="the dataset folder (new, empty, "
                   "or one this command wrote)")
    p.add_argument("--from", dest="source", default=None, metavar="PATH|s3://BUCKET/PREFIX",
                   help="a node: its pulled copy (default: the one run under "
                   "PULL_DIR/NODE/); a campaign: its S3 prefix or a copy of it (default: "
                   "its [[campaigns]] s3)")
    p.add_argument("--endpoint-url", default=None, help="S3 endpoint for a campaign's s3:// "
                   "(default: its [[campaigns]] endpoint_url)")
    p.add_argument("--shard-mb", type=float, default=256.0, help="text per Parquet shard")
    p.add_argument("--push", default=None, metavar="REPO_ID",
                   help="then upload DIR to this Hugging Face dataset repo (OWNER/NAME)")
    p.add_argument("--public", action="store_true", help="create the repo public (default "
                   "private)")
    p.add_argument("--force", action="store_true", help="export afresh into a DIR that holds "
                   "your edits (the card) or files you added: they are removed")
    p.set_defaults(runner=cmd_dataset, sync=True)


def node_copy_dir(pull_dir: Path, node: str) -> Path:
    """The one run pulled for `node`; FleetError naming what to give otherwise."""
    base = pull_dir / node
    runs = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise FleetError(f"{node}: nothing pulled in {base}: `fleetdeck pull {node} --all` "
                         "first, or give --from")
    raise FleetError(f"{node}: {len(runs)} runs pulled in {base} "
                     f"({', '.join(p.name for p in runs)}): give --from PULL_DIR/{node}/RUN")


def export(target: str, source: str, is_campaign: bool, out: Path, shard_bytes: int,
           endpoint_url: str | None = None, s3_client: Any = None,
           pull_dir: Path | None = None, force: bool = False) -> dict[str, Any]:
    """Verify the source, write DIR; what was written. NotVerified, ExportError, SourceError.
    A campaign's nodes' GPU-hours and cost come from their pulled copies in `pull_dir`. A DIR
    holding the user's edits or additions is refused unless `force`."""
    from console.dataset import export as ex
    from console.dataset.card import card
    from console.dataset.journals import attach_pulled
    from console.dataset.source import campaign, node_copy

    tmp = ex.prepare_dir(out, force)
    try:
        data = (campaign(source, tmp / ".cache", endpoint_url, s3_client) if is_campaign
                else node_copy(Path(source)))
        if is_campaign and pull_dir is not None:
            attach_pulled(data.nodes, pull_dir)
        fig = ex.write_shards(data, tmp, shard_bytes)
        shutil.rmtree(tmp / ".cache", ignore_errors=True)
        with open(tmp / "failures.jsonl", "w") as f:
            for fl in data.failures:
                f.write(json.dumps({"index": fl.index, "error": fl.error,
                                    "message": fl.message, "attempt": fl.attempt}) + "\n")
        if data.kind == "campaign" and data.nodes:
            # Every node run's, as S3 holds it (null where it holds none).
            every = {f"{r.node}/{r.run_id}": r.provenance for r in data.nodes}
            (tmp / "provenance.json").write_text(json.dumps({"nodes": every}, indent=1) + "\n")
        elif data.provenance is not None:
            (tmp / "provenance.json").write_text(json.dumps(data.provenance, indent=1) + "\n")
        (tmp / "README.md").write_text(card(data, fig))
        summary = {"target": target, "source": source, "dir": str(out), "rows": fig.rows,
                   "shards": len(fig.shards), "failed": len(data.failures),
                   "superseded": fig.stats.superseded, "lines_read": fig.stats.lines,
                   "made_at": time.time()}
        ex.finish(tmp, out, summary)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def dataset_for_node(fleet: Any, node: str) -> dict[str, Any]:
    """The TUI's action: NODE's pulled copy into PULL_DIR/datasets/NODE (blocking)."""
    source = node_copy_dir(fleet.pull_dir, node)
    return export(node, str(source), False, fleet.pull_dir / "datasets" / node,
                  256 << 20)


def campaign_source(fleet: Any, name: str) -> tuple[str, str | None]:
    """A campaign's S3 prefix and endpoint as its [[campaigns]] table gives them; FleetError
    naming what to set otherwise."""
    c = fleet.campaign(name)
    if c.s3 is None:
        raise FleetError(f"campaign {name}: give --from s3://BUCKET/PREFIX (its nodes' [s3] "
                         "section's) or a copy of that prefix, or set s3 = \"s3://BUCKET/"
                         "PREFIX\" (and endpoint_url) in its [[campaigns]] table")
    return c.s3, c.endpoint_url


def dataset_for_campaign(fleet: Any, name: str) -> dict[str, Any]:
    """The TUI's action on a campaign row: the campaign through its commits, read from its
    [[campaigns]] s3 with the console's own S3 credentials, into PULL_DIR/datasets/NAME
    (blocking)."""
    source, endpoint = campaign_source(fleet, name)
    return export(name, source, True, fleet.pull_dir / "datasets" / name, 256 << 20, endpoint,
                  pull_dir=fleet.pull_dir)


def cmd_dataset(args: argparse.Namespace) -> int:
    from console.dataset.export import MARK, ExportError, earlier_export, users_own
    from console.dataset.push import PushError, push
    from console.dataset.source import NotVerified
    from trainer.readstats import SourceError

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        say("fleetdeck dataset: needs pyarrow: pip install 'fleetdeck[dataset]'")
        return EXIT_USAGE
    try:
        fleet = load(args)
        is_campaign = fleet.has_campaign(args.node_name)
        if not is_campaign:
            fleet.node(args.node_name)  # a name the fleet file knows
        source, endpoint = args.source, args.endpoint_url
        if source is None and is_campaign:
            source, endpoint = campaign_source(fleet, args.node_name)
            endpoint = args.endpoint_url or endpoint
        if source is None:
            source = str(node_copy_dir(fleet.pull_dir, args.node_name))
    except FleetError as exc:
        say(str(exc))
        return EXIT_USAGE
    out = Path(args.to).expanduser()
    reused, why = earlier_export(out, args.node_name, source) if args.push else (None, "")
    try:
        if reused is not None:
            say(f"fleetdeck dataset {args.node_name}: {shown(why)}: pushed as it is, not "
                "exported again (remove it, or run without --push, to export afresh)")
            summary = {k: v for k, v in reused.items() if k != "files"} | {"reused": True}
        else:
            if args.push and (out / MARK).is_file():
                say(f"fleetdeck dataset {args.node_name}: exporting again: {shown(why)}")
            own = users_own(out) if args.force else []
            summary = export(args.node_name, source, is_campaign, out,
                             max(1, int(args.shard_mb * (1 << 20))), endpoint,
                             pull_dir=fleet.pull_dir, force=args.force)
            if own:
                say(f"fleetdeck dataset {args.node_name}: --force: removed "
                    f"{shown(', '.join(own))} (yours) with the earlier export")
    except NotVerified as exc:
        say(f"fleetdeck dataset {args.node_name}: {shown(str(exc))}")
        for p in exc.problems[:50]:
            say(f"  - {shown(p)}")
        return EXIT_CHECK
    except (ExportError, SourceError) as exc:
        say(f"fleetdeck dataset {args.node_name}: {shown(str(exc))}")
        return EXIT_CHECK
    print(json.dumps(summary), flush=True)
    if args.push:
        assert (out / MARK).is_file()
        try:
            url = push(out, args.push, private=not args.public)
        except PushError as exc:
            say(f"fleetdeck dataset {args.node_name}: {shown(str(exc))}")
            return EXIT_CHECK
        print(json.dumps({"pushed": args.push, "url": url}), file=sys.stdout, flush=True)
    return EXIT_OK
