"""The campaign's RPC parameters, checked once for the stdio session and the supervisor:
`cede {id, count}`, `adopt {id, ranges, node, shard}`, and `launch`'s `shard`, `campaign`
and `check` (a dry run that starts nothing and says what the node would pin)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from agents.engine import prompts as prompt_io
from agents.engine.ownership import OwnershipError, OwnershipEvent, check_ranges
from agents.rpc.protocol import INVALID_PARAMS, REFUSED, RpcError
from agents.rundir.schema import pin_decoder
from agents.rundir.shard import parse_shard
from agents.rundir.spec import RunSpec, SpecError, load_spec

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def move_id(p: dict[str, Any]) -> str:
    value = p.get("id")
    if not isinstance(value, str) or not _ID.match(value):
        raise RpcError(INVALID_PARAMS, f"id must be 1-128 of A-Z a-z 0-9 _ . : - (starting "
                       f"with a letter or digit), got {value!r}")
    return value


def cede_params(p: dict[str, Any]) -> tuple[str, int]:
    count = p.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise RpcError(INVALID_PARAMS, f"count must be a whole number >= 1, got {count!r}")
    return move_id(p), count


def adopt_params(p: dict[str, Any]) -> tuple[str, list[tuple[int, int, int]], str | None,
                                            str | None]:
    id_ = move_id(p)
    try:
        ranges = check_ranges(p.get("ranges"), "adopt")
    except OwnershipError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None
    node, shard = p.get("node"), p.get("shard")
    if node is not None and (not isinstance(node, str) or not _NAME.match(node)):
        raise RpcError(INVALID_PARAMS, f"node must be a node name, got {node!r}")
    if shard is not None:
        try:
            shard = parse_shard(shard, "adopt: shard").text
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
    return id_, ranges, node, shard


def event_reply(ev: OwnershipEvent, s3_error: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(ev)
    if s3_error is not None:
        out["s3_error"] = s3_error
    return out


def launch_overrides(p: dict[str, Any], run_dir: Path) -> dict[str, dict[str, Any]]:
    """What a campaign launch sets over the spec: the shard, the campaign's name, and this
    node's run dir (one spec template serves every node)."""
    out: dict[str, dict[str, Any]] = {}
    shard, campaign = p.get("shard"), p.get("campaign")
    if shard is not None:
        try:
            out.setdefault("generate", {})["shard"] = parse_shard(shard, "launch: shard").text
        except ValueError as exc:
            raise RpcError(INVALID_PARAMS, str(exc)) from None
    if campaign is not None:
        if not isinstance(campaign, str) or not _NAME.match(campaign):
            raise RpcError(INVALID_PARAMS, f"campaign must be a plain name, got {campaign!r}")
        out.setdefault("run", {}).update(campaign=campaign, dir=str(run_dir))
    return out


def spec_for_launch(spec_path: str, overrides: dict[str, dict[str, Any]]) -> RunSpec:
    """The spec a launch starts: the file with the campaign's keys over it. A file that names
    a shard of its own other than the one the campaign gives is refused (two nodes would both
    think they are that shard)."""
    try:
        own = load_spec(spec_path)
        spec = load_spec(spec_path, overrides=overrides or None)
    except SpecError as exc:
        raise RpcError(REFUSED, str(exc)) from None
    mine = own.generate.shard if own.generate is not None else None
    given = overrides.get("generate", {}).get("shard")
    if mine is not None and given is not None and parse_shard(mine, spec_path).text != given:
        raise RpcError(REFUSED, f"{spec_path}: [generate] shard = {mine!r} in the file, but "
                       f"the campaign makes this node {given}: remove the shard from the "
                       "file (the campaign sets it) or fix the campaign")
    return spec


def launch_check(spec_path: str, run_dir: Path, overrides: dict[str, dict[str, Any]]
                 ) -> dict[str, Any]:
    """A campaign's check round: load the spec as the launch would, and say what this node
    would pin (a pinned run dir answers from its pin: a shard or a prompts file other than
    the pinned one is refused here, before any node starts)."""
    spec = spec_for_launch(spec_path, overrides)
    out: dict[str, Any] = {"run_dir": str(run_dir), "kind": spec.run.kind,
                           "shard": spec.shard.text if spec.shard else None}
    if spec.generate is None:
        return out
    pin_path = run_dir / "run.pin.json"
    if pin_path.exists():
        pin = pin_decoder.decode(pin_path.read_bytes())
        if pin.shard != out["shard"]:
            raise RpcError(REFUSED, f"{pin_path}: this run dir is pinned to shard "
                           f"{pin.shard or 'none'}, not {out['shard'] or 'none'}: a run dir "
                           "holds one shard for good (use another run dir)")
        out.update(prompts_sha256=pin.prompts_sha256, prompts_lines=pin.prompts_lines,
                   pinned=True)
        return out
    try:
        sha, lines, _ = prompt_io.scan(spec.prompts_path)
    except OSError as exc:
        raise RpcError(REFUSED, f"{spec.prompts_path}: cannot read the prompts file: "
                       f"{exc.strerror or exc}") from None
    out.update(prompts_sha256=sha, prompts_lines=lines, pinned=False)
    return out


__all__ = ["adopt_params", "cede_params", "event_reply", "launch_check", "launch_overrides",
           "move_id", "spec_for_launch"]
