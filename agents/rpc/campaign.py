"""A campaign launch's RPC parameters, checked once for the stdio session and the
supervisor: `launch`'s `queue_node` (this node's name in a generation campaign's queue),
`campaign`, and `check` (a dry run that starts nothing: what the node would pin, and a probe
of its store for the conditional writes the queue needs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agents.engine import prompts as prompt_io
from agents.rpc.protocol import INVALID_PARAMS, REFUSED, RpcError
from agents.rundir.schema import pin_decoder
from agents.rundir.spec import RunSpec, SpecError, load_spec, name_problem

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def launch_overrides(p: dict[str, Any], run_dir: Path) -> dict[str, dict[str, Any]]:
    """What a campaign launch sets over the spec: the node's name in the queue, the
    campaign's name, and this node's run dir (one spec template serves every node)."""
    out: dict[str, dict[str, Any]] = {}
    node, campaign = p.get("queue_node"), p.get("campaign")
    if node is not None:
        if not isinstance(node, str) or name_problem(node) is not None or not _NAME.match(node):
            raise RpcError(INVALID_PARAMS, f"queue_node must be a node name, got {node!r}")
        out["queue"] = {"node": node}
    if campaign is not None:
        if not isinstance(campaign, str) or not _NAME.match(campaign):
            raise RpcError(INVALID_PARAMS, f"campaign must be a plain name, got {campaign!r}")
        out.setdefault("run", {}).update(campaign=campaign, dir=str(run_dir))
    return out


def spec_for_launch(spec_path: str, overrides: dict[str, dict[str, Any]]) -> RunSpec:
    """The spec a launch starts: the file with the campaign's keys over it."""
    try:
        return load_spec(spec_path, overrides=overrides or None)
    except SpecError as exc:
        raise RpcError(REFUSED, str(exc)) from None


def launch_check(spec_path: str, run_dir: Path, overrides: dict[str, dict[str, Any]]
                 ) -> dict[str, Any]:
    """A campaign's check round: load the spec as the launch would, say what this node would
    pin, and probe its store for conditional writes (a store that ignores them is refused
    here, before any node starts)."""
    spec = spec_for_launch(spec_path, overrides)
    out: dict[str, Any] = {"run_dir": str(run_dir), "kind": spec.run.kind}
    if spec.generate is None:
        return out
    if spec.queue is not None and spec.s3 is not None:
        from agents.engine.uploader import make_s3_client
        from agents.queue.layout import Layout
        from agents.queue.s3ops import QueueStoreError, probe

        where = f"the S3 store at {spec.s3.endpoint_url or 'AWS'} (bucket {spec.s3.bucket!r})"
        try:
            probe(make_s3_client(spec.s3, timeout_s=30), spec.s3.bucket,
                  Layout(spec.s3.prefix), where)
        except QueueStoreError as exc:
            raise RpcError(REFUSED, str(exc)) from None
        except Exception as exc:  # S3 away, no such bucket, no credentials
            raise RpcError(REFUSED, f"{where}: cannot probe it: {type(exc).__name__}: "
                           f"{exc}") from None
        out["queue_prefix"] = f"s3://{spec.s3.bucket}/{spec.s3.prefix}"
        out["queue_node"] = spec.queue.node
    pin_path = run_dir / "run.pin.json"
    if pin_path.exists():
        pin = pin_decoder.decode(pin_path.read_bytes())
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


__all__ = ["launch_check", "launch_overrides", "spec_for_launch"]
