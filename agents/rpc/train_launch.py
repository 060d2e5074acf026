"""`launch`'s parameters for a training run across nodes: `node_rank` and `nnodes` (and
optionally `rdzv_endpoint`), which a training campaign's launch gives each node; kept as
`[train] node_rank`, `nodes` and `rdzv_endpoint` in the run directory's run.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from agents.rpc.protocol import INVALID_PARAMS, RpcError
from agents.rundir.spec import RunSpec

KEYS = ("node_rank", "nnodes", "rdzv_endpoint")


def _whole(p: dict[str, Any], key: str, least: int) -> int:
    value = p.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise RpcError(INVALID_PARAMS, f"launch: {key} must be a whole number >= {least}, "
                       f"got {value!r}")
    return value


def train_overrides(p: dict[str, Any], spec_path: str | None) -> dict[str, dict[str, Any]]:
    """{"train": {"node_rank": R, "nodes": N, ...}} from the params, or {} without them; the
    spec's own checks then judge the values (node_rank < nodes, rdzv_endpoint)."""
    if not any(p.get(k) is not None for k in KEYS):
        return {}
    if "node_rank" not in p or "nnodes" not in p:
        raise RpcError(INVALID_PARAMS, "launch: node_rank and nnodes go together (this node's "
                       "rank and the number of training nodes)")
    values: dict[str, Any] = {"node_rank": _whole(p, "node_rank", 0),
                              "nodes": _whole(p, "nnodes", 1)}
    endpoint = p.get("rdzv_endpoint")
    if endpoint is not None:
        if not isinstance(endpoint, str):
            raise RpcError(INVALID_PARAMS, f"launch: rdzv_endpoint must be \"HOST:PORT\", got "
                           f"{endpoint!r}")
        values["rdzv_endpoint"] = endpoint
    kind = _kind(spec_path)
    if kind is not None and kind != "train":
        raise RpcError(INVALID_PARAMS, f"launch: node_rank and nnodes are for training runs; "
                       f"{spec_path} is a run of kind {kind!r}")
    return {"train": values}


def _kind(spec_path: str | None) -> str | None:
    """The spec's [run] kind, or None when it cannot be read here (load_spec says why)."""
    if not spec_path:
        return None
    try:
        raw = tomllib.loads(Path(spec_path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    run = raw.get("run")
    kind = run.get("kind", "generate") if isinstance(run, dict) else None
    return kind if isinstance(kind, str) else None


def launched_otherwise(p: dict[str, Any], spec: RunSpec) -> str | None:
    """Why a `launch` with a node rank does not fit the run a supervisor already runs."""
    if p.get("node_rank") is None and p.get("nnodes") is None:
        return None
    have = (spec.train.node_rank, spec.train.nodes) if spec.train else None
    wanted = (p.get("node_rank"), p.get("nnodes"))
    if have == wanted:
        return None
    shown = f"rank {have[0]} of {have[1]}" if have else "not a training run"
    return (f"{spec.run_dir}: this run is {shown}, not rank {wanted[0]} of {wanted[1]}; its "
            "supervisor runs what it was launched with")
