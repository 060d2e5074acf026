"""Where each of the queue's facts lives under the campaign's prefix. Chunk numbers are
zero-padded so a listing comes back in order."""

from __future__ import annotations

from dataclasses import dataclass

CHUNK_DIGITS = 7


@dataclass(frozen=True)
class Layout:
    prefix: str  # `[s3] prefix`, "" or ending in "/"

    @property
    def pin(self) -> str:
        return f"{self.prefix}campaign.json"

    def gen_record(self, generation: int) -> str:
        return f"{self.prefix}gens/gen-{generation:04d}.json"

    @property
    def gens(self) -> str:
        return f"{self.prefix}gens/"

    def leases(self, generation: int) -> str:
        return f"{self.prefix}leases/gen-{generation:04d}/"

    def lease(self, generation: int, chunk: int) -> str:
        return f"{self.leases(generation)}{chunk:0{CHUNK_DIGITS}d}"

    def backups(self, generation: int) -> str:
        return f"{self.prefix}backups/gen-{generation:04d}/"

    def backup(self, generation: int, chunk: int) -> str:
        return f"{self.backups(generation)}{chunk:0{CHUNK_DIGITS}d}"

    def commits(self, generation: int) -> str:
        return f"{self.prefix}commits/gen-{generation:04d}/"

    def commit(self, generation: int, chunk: int) -> str:
        return f"{self.commits(generation)}{chunk:0{CHUNK_DIGITS}d}"

    def batches(self, node: str, run_id: str) -> str:
        return f"{self.prefix}batches/{node}/{run_id}/"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}nodes/"

    def member(self, node: str) -> str:
        return f"{self.nodes}{node}/member.json"

    def given_back(self, node: str) -> str:
        return f"{self.nodes}{node}/given-back.json"

    def journal(self, node: str, run_id: str, name: str) -> str:
        return f"{self.prefix}journals/{node}/{run_id}/{name}"

    def probe(self, token: str) -> str:
        return f"{self.prefix}probe/{token}"


def chunk_of_key(key: str) -> int | None:
    """The chunk number at the end of a lease, backup or commit key; None for anything else."""
    tail = key.rsplit("/", 1)[-1]
    return int(tail) if len(tail) == CHUNK_DIGITS and tail.isascii() and tail.isdigit() else None
