"""RPC `reassign {id, shard, node, to}`, answered by the node that takes a dead node's shard
over (the stdio session and the supervisor alike): the record goes to S3 first, then this run
adopts its ranges by the record's id through the ordinary adopt path, which sends them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from agents.artifacts.reassign import ReassignRefused, plan_reassign
from agents.artifacts.verify import VerifyError
from agents.engine.reassigned import reassign_id
from agents.rpc.campaign import move_id
from agents.rpc.protocol import INVALID_PARAMS, REFUSED, RpcError
from agents.rundir.control import audit
from agents.rundir.shard import parse_shard

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def reassign_params(p: dict[str, Any]) -> tuple[str, str, str, str]:
    id_ = move_id(p)
    try:
        shard = parse_shard(p.get("shard"), "reassign: shard").text
    except ValueError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None
    names = []
    for key in ("node", "to"):
        value = p.get(key)
        if not isinstance(value, str) or not _NAME.match(value):
            raise RpcError(INVALID_PARAMS, f"{key} must be a node name, got {value!r}")
        names.append(value)
    if names[0] == names[1]:
        raise RpcError(INVALID_PARAMS, f"reassign: node and to are both {names[0]!r}")
    want = reassign_id(parse_shard(shard, "reassign: shard").tag)
    if id_ != want:
        # One id per shard: a retry finds its record, and the shard's node, cut off and still
        # running, looks for exactly this one before every put (the uploader's fence).
        raise RpcError(INVALID_PARAMS, f"reassign: the id of shard {shard}'s reassign is "
                       f"{want!r}, not {id_!r}")
    return id_, shard, names[0], names[1]


async def reassign(run_dir: Path, p: dict[str, Any],
                   adopt: Callable[[dict[str, Any]], Awaitable[Any]]) -> dict[str, Any]:
    """Write (or find) the record, then adopt its ranges with `adopt`, the session's own."""
    id_, shard, node, to = reassign_params(p)
    audit(run_dir, "reassign", {"id": id_, "shard": shard, "node": node, "to": to},
          p.get("who"))
    try:
        rec, existed, url = await asyncio.to_thread(plan_reassign, run_dir, id_, shard, node,
                                                    to)
    except (ReassignRefused, VerifyError, ValueError, OSError) as exc:
        raise RpcError(REFUSED, str(exc)) from None
    adopted = await adopt({"id": rec.id, "ranges": [list(r) for r in rec.ranges],
                           "node": rec.node, "shard": rec.shard, "who": p.get("who")})
    return {"record": msgspec.to_builtins(rec), "key": url, "existed": existed,
            "adopt": adopted}


__all__ = ["reassign", "reassign_params"]
