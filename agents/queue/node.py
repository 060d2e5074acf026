"""The queue as a node's agent answers for it, from the run directory's kept spec: the
campaign's state (`status`), its proof (`verify`), a retry generation (`retry`) and the
given-back record. Blocking: the RPC layer calls these from a thread. Each node has the
campaign's S3 credentials; the console needs none."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from agents.engine.uploader import make_s3_client
from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.board import Board, Me
from agents.queue.layout import Layout
from agents.queue.retry import described, new_generation
from agents.queue.union import verify
from agents.queue.worker import FOLDER, ChunkEvent
from agents.rundir.spec import RunSpec, SpecError, load_run_spec


class NotAQueueRun(ValueError):
    pass


def _spec(run_dir: Path) -> RunSpec:
    try:
        spec = load_run_spec(run_dir)
    except SpecError as exc:
        raise NotAQueueRun(f"{run_dir}: {exc}") from None
    if spec.queue is None or spec.s3 is None:
        raise NotAQueueRun(f"{run_dir}: not a campaign node's run (no [queue] in its run.toml)")
    return spec


def _client(spec: RunSpec) -> tuple[Any, str, str]:
    assert spec.s3 is not None
    return make_s3_client(spec.s3), spec.s3.bucket, spec.s3.prefix


def verify_report(run_dir: Path, deep: float = 0.0) -> dict[str, Any]:
    client, bucket, prefix = _client(_spec(run_dir))
    v = verify(client, bucket, prefix, deep=deep)
    out: dict[str, Any] = msgspec.to_builtins(v.__dict__)
    out["summary"] = v.summary()
    return out


def retry(run_dir: Path, why: Literal["failed", "truncated"], max_tokens: int | None,
          who: str | None) -> dict[str, Any]:
    spec = _spec(run_dir)
    assert spec.queue is not None
    client, bucket, prefix = _client(spec)
    gen = new_generation(client, bucket, prefix, why, max_tokens,
                         f"{who or 'console'} via {spec.queue.node}")
    if gen is None:
        return {"generation": None, "summary": f"nothing {why} in the commits: no retry"}
    return {"generation": gen.generation, "chunks": len(gen.chunks), "summary": described(gen)}


def status(run_dir: Path) -> dict[str, Any]:
    """The campaign as its prefix holds it: per generation chunks, commits and leases (by
    node, expired or not on the store's clock), members and given-back records."""
    spec = _spec(run_dir)
    assert spec.queue is not None
    client, bucket, prefix = _client(spec)
    board = Board(client, bucket, prefix, Me("-", "-"), spec.queue.lease_s, spec.queue.skew)
    layout = Layout(prefix)
    got = s3ops.read(client, bucket, layout.pin)
    if got is None:
        return {"pinned": False, "generations": [], "nodes": {}}
    pin: rec.CampaignPin = rec.decode(rec.CampaignPin, got[0], board.url(layout.pin))
    board.pin(pin)
    gens = []
    for g in board.generations(pin):
        st = board.state(g)
        leases: dict[str, int] = {}
        expired = 0
        for n in st.leases:
            if n in st.committed:
                continue
            lease = board.read_lease(st.chunks[n])
            if lease is None:
                continue
            leases[lease[0].node] = leases.get(lease[0].node, 0) + 1
            expired += board.expired(st, n)
        gens.append({"generation": g, "chunks": len(st.chunks), "committed": len(st.committed),
                     "leased": leases, "expired": expired})
    nodes: dict[str, dict[str, Any]] = {}
    for item in s3ops.listing(client, bucket, layout.nodes)[0]:
        name, _, leaf = item.key[len(layout.nodes):].partition("/")
        body = s3ops.read(client, bucket, item.key)
        if body is None:
            continue
        try:
            if leaf == "member.json":
                m = rec.decode(rec.Member, body[0], board.url(item.key))
                nodes.setdefault(name, {})["member"] = msgspec.to_builtins(m)
            elif leaf == "given-back.json":
                b = rec.decode(rec.GivenBack, body[0], board.url(item.key))
                nodes.setdefault(name, {})["given_back"] = msgspec.to_builtins(b)
        except ValueError as exc:
            nodes.setdefault(name, {})["problem"] = str(exc)
    return {"pinned": True, "campaign": pin.campaign, "prompts_lines": pin.prompts_lines,
            "chunk_size": pin.chunk_size, "generations": gens, "nodes": nodes}


def leaving_problems(run_dir: Path) -> list[str]:
    """Why this node cannot be given back yet: an engine running, a chunk it took that has
    no commit outcome (its lease not yet expired or released), an upload pending."""
    spec = _spec(run_dir)
    out = []
    path = run_dir / FOLDER / "chunks.jsonl"
    open_chunks: dict[tuple[int, int], ChunkEvent] = {}
    if path.exists():
        decoder = msgspec.json.Decoder(ChunkEvent)
        for raw in path.read_bytes().splitlines():
            if not raw.strip():
                continue
            try:
                ev = decoder.decode(raw)
            except msgspec.DecodeError:
                continue
            if ev.op == "take":
                open_chunks[(ev.generation, ev.chunk)] = ev
            else:
                open_chunks.pop((ev.generation, ev.chunk), None)
    if open_chunks:
        client, bucket, prefix = _client(spec)
        layout = Layout(prefix)
        for (g, n) in sorted(open_chunks):
            if not s3ops.exists(client, bucket, layout.commit(g, n)):
                out.append(f"chunk {n} of generation {g}: taken by this node, not committed by "
                           "anyone yet")
    return out


def give_back(run_dir: Path) -> dict[str, Any]:
    """The given-back record in the campaign's prefix, which any console reads: written only
    when this node holds nothing the campaign still needs."""
    spec = _spec(run_dir)
    assert spec.queue is not None
    problems = leaving_problems(run_dir)
    if problems:
        raise NotAQueueRun("not given back: " + "; ".join(problems[:5]))
    client, bucket, prefix = _client(spec)
    run_id = _run_id(run_dir)
    layout = Layout(prefix)
    commits = 0
    path = run_dir / FOLDER / "chunks.jsonl"
    if path.exists():
        commits = sum(1 for raw in path.read_bytes().splitlines()
                      if b'"commit"' in raw and b'"won":true' in raw)
    record = rec.GivenBack(node=spec.queue.node, run_id=run_id, at=time.time(), commits=commits,
                           reason=f"decommission-check passed on {socket.gethostname()}")
    client.put_object(Bucket=bucket, Key=layout.given_back(spec.queue.node),
                      Body=rec.encode(record), ContentType="application/json")
    return msgspec.to_builtins(record)


def _run_id(run_dir: Path) -> str:
    from agents.queue.worker import member_file

    try:
        return str(msgspec.json.decode(member_file(run_dir).read_bytes())["run_id"])
    except (FileNotFoundError, KeyError, msgspec.DecodeError, TypeError):
        return "-"
