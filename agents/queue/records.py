"""What the queue keeps in S3, one small JSON object per fact. Every record names the node
and the run (a run directory's id) that wrote it, so a record is never anonymous."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agents.queue.ranges import Ranges

VERSION = 1


class CampaignPin(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/campaign.json`, put once by the first node to start: what every index means
    and how the set is cut. A node whose spec differs is refused."""

    campaign: str
    prompts_sha256: str
    prompts_lines: int
    chunk_size: int
    model: str | None
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any]
    created_at: float
    created_by: str
    version: int = VERSION

    def chunks(self) -> int:
        """Generation 0's chunk count: it follows from the pin alone."""
        return -(-self.prompts_lines // self.chunk_size)


class Lease(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/leases/gen-G/CHUNK`: who works on a chunk, until when. Renewed with If-Match on
    its ETag; taken over past its expiry with If-Match, the epoch one higher."""

    node: str
    run_id: str
    epoch: int
    claimed_at: float  # the holder's clock: when this epoch began
    renewed_at: float
    lease_s: float


class Backup(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/backups/gen-G/CHUNK`: one node runs a copy of a slow running chunk (MapReduce's
    backup task); created only where none is, so a chunk has one backup at most."""

    node: str
    run_id: str
    at: float
    holder: str  # the lease holder it backs up


class BatchPart(msgspec.Struct, forbid_unknown_fields=True):
    """A batch object that holds lines of the chunk: its key and SHA-256 (as put) and which of
    the chunk's indices it holds."""

    key: str
    sha256: str
    size: int
    indices: Ranges


class Commit(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/commits/gen-G/CHUNK`, created only where none is: the first commit wins. Every
    index of the chunk is in `done` (its line in one of `batches`) or in `failed`."""

    generation: int
    chunk: int
    node: str
    run_id: str
    epoch: int  # of the lease it held (0: a backup without a lease)
    started_at: float
    committed_at: float
    done: Ranges
    failed: Ranges
    truncated: Ranges  # done, but finish_reason "length"
    batches: list[BatchPart]
    attempt: int  # the `attempt` of this generation's lines
    bad_input: Ranges = msgspec.field(default_factory=list)  # failed: the prompt line itself
    version: int = VERSION


class Generation(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/gens/gen-G.json` for G >= 1: a retry over exactly the indices the commits
    before it marked failed or truncated, cut into chunks."""

    generation: int
    why: Literal["failed", "truncated"]
    chunks: list[Ranges]
    max_tokens: int | None
    created_at: float
    created_by: str
    version: int = VERSION


class Member(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/nodes/NODE/member.json`: a node that joined, and with which run."""

    node: str
    run_id: str
    joined_at: float
    host: str


class GivenBack(msgspec.Struct, forbid_unknown_fields=True):
    """`PREFIX/nodes/NODE/given-back.json`: written by the node's agent during a passing
    decommission check (no lease held, every commit of its in S3): any console sees it."""

    node: str
    run_id: str
    at: float
    commits: int
    reason: str = "decommission-check passed"


def decode(kind: type[Any], data: bytes, where: str) -> Any:
    """A record, or ValueError naming where and why (a node trusts nothing it reads)."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{where}: not a {kind.__name__} record: {exc}") from None


encode = msgspec.json.Encoder().encode
