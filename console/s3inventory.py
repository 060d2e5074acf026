"""`fleetdeck s3-inventory s3://BUCKET[/PREFIX]`: what S3 still holds and costs, by prefix, and
whether a run the console knows wrote it. A run root is where a run's pin lies
(`ROOT/journals/run/run.pin.json`) or a campaign's (`ROOT/campaign.json`); every other key is
counted under its first folder below PREFIX. The console knows a run by what it holds here:
the pulled copies under its pull dir (and `--pulls DIR`) and the run dirs of its `local`
nodes, each with its run.toml's `[s3]` and its upload records (uploads.jsonl). A prefix none
of them wrote is `stale`. Credentials are the nodes' own: boto3's chain with an optional
profile (agents/engine/uploader.py `make_s3_client`). Never imports Textual."""

from __future__ import annotations

import argparse
import json
import os
import time
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.schema import UploadRecord
from console.fleet import FleetError, load_fleet
from console.headless import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, say
from console.sanitize import shown

# S3 Standard in us-east-1, first 50 TB, per GB-month (AWS bills GB of 2^30 bytes).
S3_STANDARD_GB_MONTH = 0.023
GB = 2**30
PIN_SUFFIX = "journals/run/run.pin.json"
CAMPAIGN_PIN = "campaign.json"
RECENT_S = 24 * 3600  # a stale prefix written this recently may be a live run not pulled yet
MAX_RECORDS_BYTES = 256 * 2**20  # an uploads.jsonl larger than this is not read


class BadTarget(ValueError):
    pass


def parse_target(text: str) -> tuple[str, str]:
    """s3://BUCKET[/PREFIX] -> (bucket, prefix ending in '/' or empty)."""
    if not text.startswith("s3://"):
        raise BadTarget(f"{text!r}: give s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = text[5:].partition("/")
    if not bucket or any(c in bucket for c in " \\\x00"):
        raise BadTarget(f"{text!r}: no bucket name after s3://")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


# -- what the console knows ------------------------------------------------------------------

@dataclass(slots=True)
class KnownRun:
    """A run directory here (a pulled copy or a local node's): where its [s3] writes, and
    the keys its upload records name."""

    name: str
    bucket: str | None = None
    prefix: str | None = None
    keys: set[str] = field(default_factory=set)


def _s3_of(run_toml: Path) -> tuple[str | None, str | None]:
    try:
        raw = tomllib.loads(run_toml.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None, None
    s3 = raw.get("s3")
    if not isinstance(s3, dict):
        return None, None
    bucket, prefix = s3.get("bucket"), s3.get("prefix", "")
    return (bucket if isinstance(bucket, str) else None,
            prefix if isinstance(prefix, str) else None)


def _records(path: Path) -> Iterator[UploadRecord]:
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_RECORDS_BYTES:
            return
        lines = path.read_bytes().splitlines()
    except OSError:
        return
    decoder = msgspec.json.Decoder(UploadRecord)
    for line in lines:
        try:
            yield decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue  # a torn last line, or not ours: it proves nothing


def known_run(name: str, run_dir: Path, bucket: str) -> KnownRun:
    s3_bucket, s3_prefix = _s3_of(run_dir / "run.toml")
    run = KnownRun(name, s3_bucket, s3_prefix)
    run.keys = {r.key for r in _records(run_dir / "uploads.jsonl") if r.bucket == bucket}
    return run


def run_dirs(folders: Iterable[Path]) -> Iterator[tuple[str, Path]]:
    """The run dirs in pull folders: PULL_DIR/NODE/RUN holding run.toml (symlinks passed by)."""
    for folder in folders:
        try:
            nodes = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            continue
        for node in nodes:
            try:
                runs = sorted(p for p in node.iterdir() if p.is_dir() and not p.is_symlink())
            except OSError:
                continue
            for run in runs:
                if (run / "run.toml").is_file():
                    yield f"{node.name}/{run.name}", run


def known_runs(bucket: str, pull_dirs: list[Path], local: list[tuple[str, Path]]
               ) -> list[KnownRun]:
    found = [known_run(name, path, bucket) for name, path in [*run_dirs(pull_dirs), *local]]
    return [r for r in found if r.keys or r.bucket == bucket]


# -- the listing -----------------------------------------------------------------------------

@dataclass(slots=True)
class Group:
    prefix: str
    bytes: int = 0
    objects: int = 0
    last_write: float = 0.0
    pinned: str | None = None  # "run" or "campaign": a pin lies at its root
    written_by: list[str] = field(default_factory=list)
    why: str = ""

    @property
    def known(self) -> bool:
        return bool(self.written_by)


def roots(keys: Iterable[str]) -> dict[str, str]:
    """The run and campaign roots among the keys: root prefix -> "run" or "campaign"."""
    out: dict[str, str] = {}
    for key in keys:
        if key.endswith(PIN_SUFFIX):
            out[key[: -len(PIN_SUFFIX)]] = "run"
        elif key == CAMPAIGN_PIN or key.endswith("/" + CAMPAIGN_PIN):
            out.setdefault(key[: -len(CAMPAIGN_PIN)], "campaign")
    return out


def group_of(key: str, prefix: str, pinned: list[str]) -> str:
    """The deepest root holding the key; else its folder one level below the deepest folder
    it shares with a root (so a stray prefix beside runs is a group of its own, not folded
    into their parent), at least the first folder below the prefix. A key with no folder
    there is its own group."""
    for root in pinned:  # deepest first
        if key.startswith(root):
            return root
    parts = key[len(prefix):].split("/")
    depth = 1
    for i in range(1, len(parts)):
        folder = prefix + "/".join(parts[:i]) + "/"
        if any(r.startswith(folder) for r in pinned):
            depth = i + 1
    if depth >= len(parts):
        return key
    return prefix + "/".join(parts[:depth]) + "/"


def inventory(objects: list[tuple[str, int, float]], prefix: str, runs: list[KnownRun],
              bucket: str) -> list[Group]:
    """Objects (key, size, last modified) grouped, each group judged against the known runs;
    largest first. Roots: where pins lie, and the known runs' own prefixes."""
    pins = roots(k for k, _, _ in objects)
    candidates = set(pins) | {r.prefix for r in runs if r.bucket == bucket and r.prefix}
    pinned = sorted((r for r in candidates if r.startswith(prefix) and r != prefix),
                    key=len, reverse=True)
    groups: dict[str, Group] = {}
    keys_in: dict[str, set[str]] = {}
    for key, size, when in objects:
        name = group_of(key, prefix, pinned)
        g = groups.get(name)
        if g is None:
            g = groups[name] = Group(name, pinned=pins.get(name))
        g.bytes += size
        g.objects += 1
        g.last_write = max(g.last_write, when)
        keys_in.setdefault(name, set()).add(key)
    for g in groups.values():
        for run in runs:
            how = []
            if run.bucket == bucket and run.prefix is not None and (
                    run.prefix == g.prefix or (run.prefix and g.prefix.startswith(run.prefix))):
                how.append("its run.toml [s3]")
            if run.keys & keys_in[g.prefix]:
                how.append("its upload records")
            if how:
                g.written_by.append(f"{run.name} ({' and '.join(how)})")
        g.why = "; ".join(g.written_by) if g.written_by else "stale: no known run wrote it"
    return sorted(groups.values(), key=lambda g: (-g.bytes, g.prefix))


def list_objects(client: Any, bucket: str, prefix: str) -> list[tuple[str, int, float]]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out.append((obj["Key"], int(obj["Size"]), obj["LastModified"].timestamp()))
    return out


# -- the verb --------------------------------------------------------------------------------

def add(sub: Any) -> None:
    p = sub.add_parser("s3-inventory", help="what S3 still holds and costs, by prefix; "
                       "'stale' where no run the console knows wrote it")
    p.add_argument("target", metavar="s3://BUCKET[/PREFIX]")
    p.add_argument("--price-gb-month", type=float, default=S3_STANDARD_GB_MONTH, metavar="P",
                   help=f"dollars per GB-month (default {S3_STANDARD_GB_MONTH}: S3 Standard, "
                        "us-east-1, first 50 TB)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--endpoint-url", default=None, help="an S3 other than AWS's")
    p.add_argument("--profile", default=None, help="the AWS profile (default: boto3's chain)")
    p.add_argument("--region", default=None)
    p.add_argument("--pulls", action="append", default=[], metavar="DIR",
                   help="another pull folder whose runs count as known (repeatable)")
    p.set_defaults(runner=cmd_s3_inventory, sync=True)


def _size(n: int) -> str:
    for unit, scale in (("GB", GB), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) if t else "–"


def price_name(price: float) -> str:
    return "S3 Standard" if price == S3_STANDARD_GB_MONTH else "given with --price-gb-month"


def human(bucket: str, prefix: str, groups: list[Group], price: float, now: float) -> str:
    total = sum(g.bytes for g in groups)
    objects = sum(g.objects for g in groups)
    stale = [g for g in groups if not g.known]
    lines = [f"s3://{shown(bucket)}/{shown(prefix)}: {len(groups)} prefixes, {objects:,} "
             f"objects, {_size(total)}, ${total / GB * price:,.4f}/month at "
             f"${price}/GB-month ({price_name(price)}); stale: {len(stale)} prefixes, "
             f"{_size(sum(g.bytes for g in stale))}, "
             f"${sum(g.bytes for g in stale) / GB * price:,.4f}/month"]
    width = max([len("PREFIX")] + [len(shown(g.prefix)) for g in groups])
    lines.append(f"{'PREFIX':<{width}}  {'SIZE':>10}  {'OBJECTS':>8}  {'LAST WRITE':<16}  "
                 f"{'$/MONTH':>10}  WRITTEN BY")
    for g in groups:
        why = g.why
        if not g.known and now - g.last_write < RECENT_S:
            why += f" (written {(now - g.last_write) / 3600:.1f} h ago: a live run not " \
                   "pulled yet?)"
        lines.append(f"{shown(g.prefix):<{width}}  {_size(g.bytes):>10}  {g.objects:>8,}  "
                     f"{_when(g.last_write):<16}  {g.bytes / GB * price:>10.4f}  {shown(why)}")
    return "\n".join(lines)


def as_json(bucket: str, prefix: str, groups: list[Group], price: float) -> dict[str, Any]:
    return {"bucket": bucket, "prefix": prefix, "price_gb_month": price,
            "price": price_name(price), "gb_bytes": GB,
            "prefixes": [{"prefix": g.prefix, "bytes": g.bytes, "objects": g.objects,
                          "last_write": g.last_write or None, "pinned": g.pinned,
                          "known": g.known, "stale": not g.known,
                          "written_by": g.written_by,
                          "monthly_usd": g.bytes / GB * price} for g in groups],
            "total_bytes": sum(g.bytes for g in groups),
            "monthly_usd": sum(g.bytes for g in groups) / GB * price}


def cmd_s3_inventory(args: argparse.Namespace) -> int:
    try:
        bucket, prefix = parse_target(args.target)
    except BadTarget as exc:
        say(f"fleetdeck s3-inventory: {exc}")
        return EXIT_USAGE
    if not args.price_gb_month >= 0:
        say(f"fleetdeck s3-inventory: --price-gb-month {args.price_gb_month}: give dollars "
            "per GB-month, 0 or more")
        return EXIT_USAGE
    pulls = [Path(os.path.expanduser(p)) for p in args.pulls]
    local: list[tuple[str, Path]] = []
    try:
        fleet = load_fleet(args.fleet)
    except FleetError as exc:
        if args.fleet:  # one named and broken is an error; none at all is fine
            say(f"fleetdeck s3-inventory: {exc}")
            return EXIT_USAGE
    else:
        pulls.append(fleet.pull_dir)
        local = [(n.name, Path(n.run_dir)) for n in fleet.nodes if n.local]
    runs = known_runs(bucket, pulls, local)

    from botocore.exceptions import BotoCoreError, ClientError

    from agents.engine.uploader import make_s3_client
    from agents.rundir.spec import S3Section

    spec = S3Section(bucket=bucket, prefix=prefix, endpoint_url=args.endpoint_url,
                     profile=args.profile, region=args.region)
    try:
        objects = list_objects(make_s3_client(spec), bucket, prefix)
    except (BotoCoreError, ClientError) as exc:
        say(f"fleetdeck s3-inventory: s3://{bucket}/{prefix} at "
            f"{args.endpoint_url or 'AWS'}: {exc}")
        return EXIT_UNREACHABLE
    groups = inventory(objects, prefix, runs, bucket)
    if args.json:
        print(json.dumps(as_json(bucket, prefix, groups, args.price_gb_month)))
    else:
        print(human(bucket, prefix, groups, args.price_gb_month, time.time()))
    return EXIT_OK
