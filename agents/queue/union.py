"""The campaign's data as its commits define it, and its proof (`verify CAMPAIGN`).

Each index takes its line from the highest generation that committed it; a batch line that
no commit names (a zombie's, a backup that lost) is not the campaign's. Verify reads the
commit objects (kilobytes each) and HEADs the batches they name with their checksums, never
the bodies; `deep` also reads a sample of bodies (or all) and checks each named line is there.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.board import Board, Me
from agents.queue.layout import Layout, chunk_of_key
from agents.queue.ranges import Ranges, count, expand, text, to_ranges, well_formed


@dataclass
class Union:
    """Every generation's commits, read and checked."""

    pin: rec.CampaignPin
    commits: dict[int, dict[int, rec.Commit]]  # generation -> chunk -> its commit
    chunks: dict[int, int]  # generation -> chunk count
    problems: list[str] = field(default_factory=list)
    bytes_read: int = 0

    def final(self) -> dict[int, tuple[int, str, str | None]]:
        """index -> (generation, "done" | "failed", batch key) from the highest generation
        that committed it."""
        out: dict[int, tuple[int, str, str | None]] = {}
        for g in sorted(self.commits):
            for c in self.commits[g].values():
                for part in c.batches:
                    for i in expand(part.indices):
                        out[i] = (g, "done", part.key)
                for i in expand(c.failed):
                    out[i] = (g, "failed", None)
        return out

    def parts(self) -> Iterator[tuple[rec.Commit, rec.BatchPart]]:
        for g in sorted(self.commits):
            for n in sorted(self.commits[g]):
                c = self.commits[g][n]
                for part in c.batches:
                    yield c, part


class _Keyed(msgspec.Struct):
    index: int
    attempt: int = 1


def read_union(client: Any, bucket: str, prefix: str) -> Union:
    """Every commit of every generation, each checked against its chunk: indices exactly
    the chunk's, done and failed disjoint, each done index in one batch part."""
    board = Board(client, bucket, prefix, Me("-", "-"), 1.0, 0.0)
    layout = Layout(prefix)
    got = s3ops.read(client, bucket, layout.pin)
    if got is None:
        raise FileNotFoundError(f"s3://{bucket}/{layout.pin}: no campaign pin: no node of a "
                                "campaign ever started on this prefix")
    pin: rec.CampaignPin = rec.decode(rec.CampaignPin, got[0], f"s3://{bucket}/{layout.pin}")
    u = Union(pin, {}, {}, bytes_read=len(got[0]))
    for g in board.generations(pin):
        chunks = board.chunks(g)
        u.chunks[g] = len(chunks)
        u.commits[g] = {}
        for item in s3ops.listing(client, bucket, layout.commits(g))[0]:
            n = chunk_of_key(item.key)
            if n is None:
                continue
            where = f"s3://{bucket}/{item.key}"
            body = s3ops.read(client, bucket, item.key, limit=64 << 20)
            if body is None:
                continue
            u.bytes_read += len(body[0])
            try:
                c: rec.Commit = rec.decode(rec.Commit, body[0], where)
            except ValueError as exc:
                u.problems.append(str(exc))
                continue
            if n >= len(chunks):
                u.problems.append(f"{where}: chunk {n} is not one of generation {g}'s "
                                  f"{len(chunks)}")
                continue
            bad = commit_problem(c, chunks[n].indices, g, n, pin.prompts_lines)
            if bad is not None:
                u.problems.append(f"{where}: {bad}")
                continue
            u.commits[g][n] = c
    return u


def commit_problem(c: rec.Commit, chunk: Ranges, g: int, n: int, size: int) -> str | None:
    """Why commit `c`, found at generation g's chunk n (`chunk` its indices), does not hold
    together with it; None when it does."""
    if (c.generation, c.chunk) != (g, n):
        return f"says generation {c.generation} chunk {c.chunk}"
    if c.attempt != g + 1:
        return f"attempt {c.attempt}, not {g + 1}"
    for name, ranges in (("done", c.done), ("failed", c.failed), ("truncated", c.truncated)):
        bad = well_formed(ranges, size)
        if bad is not None:
            return f"{name}: {bad}"
    done, failed = set(expand(c.done)), set(expand(c.failed))
    if done & failed:
        return f"indices both done and failed: {text(to_ranges(done & failed))}"
    want = set(expand(chunk))
    if done | failed != want:
        missing, extra = want - done - failed, (done | failed) - want
        return ("neither done nor failed: " + text(to_ranges(missing)) if missing else
                "outside the chunk: " + text(to_ranges(extra)))
    if not set(expand(c.truncated)) <= done:
        return "truncated indices that are not done"
    if not set(expand(c.bad_input)) <= failed:
        return "bad_input indices that are not failed"
    in_parts: list[int] = []
    for part in c.batches:
        bad = well_formed(part.indices, size)
        if bad is not None:
            return f"batch {part.key}: {bad}"
        in_parts += expand(part.indices)
    if len(in_parts) != len(set(in_parts)) or set(in_parts) != done:
        return "its batches do not hold each done index exactly once"
    return None


@dataclass
class Verdict:
    ok: bool
    generations: int
    chunks: int
    committed: int
    done: int
    failed: int
    batches: int
    batch_bytes: int  # what the batches named hold
    bytes_read: int  # what this verify read: commits, and bodies when deep
    heads: int
    deep_read: int
    problems: list[str]

    def summary(self) -> str:
        return (f"{'ok' if self.ok else 'FAILED'}: {self.committed}/{self.chunks} chunks "
                f"committed over {self.generations} generation(s); {self.done} done, "
                f"{self.failed} failed; {self.batches} batches ({self.batch_bytes:,} bytes) "
                f"checked by HEAD; read {self.bytes_read:,} bytes"
                + (f" ({self.deep_read} bodies read)" if self.deep_read else ""))


def verify(client: Any, bucket: str, prefix: str, deep: float = 0.0,
           seed: int | None = None) -> Verdict:
    """Every chunk of every generation committed once, every index of the set done or
    failed in its newest generation, every named batch present with its SHA-256 and size.
    `deep` (0..1) also reads that share of the batch bodies and checks each named line."""
    u = read_union(client, bucket, prefix)
    problems = list(u.problems)
    committed = sum(len(c) for c in u.commits.values())
    total = sum(u.chunks.values())
    for g, n_chunks in sorted(u.chunks.items()):
        missing = [n for n in range(n_chunks) if n not in u.commits[g]]
        if missing:
            problems.append(f"generation {g}: {len(missing)} of {n_chunks} chunks not committed "
                            f"({text(to_ranges(missing))})")
    final = u.final()
    if len(final) != u.pin.prompts_lines and not any("not committed" in p for p in problems):
        gone = set(range(u.pin.prompts_lines)) - set(final)
        problems.append(f"indices in no commit: {text(to_ranges(gone))}")
    seen: dict[str, rec.BatchPart] = {}
    batch_bytes = 0
    heads = 0
    for _, part in u.parts():
        if part.key in seen:
            if (seen[part.key].sha256, seen[part.key].size) != (part.sha256, part.size):
                problems.append(f"s3://{bucket}/{part.key}: named by two commits with "
                                "different checksums")
            continue
        seen[part.key] = part
        heads += 1
        try:
            head = client.head_object(Bucket=bucket, Key=part.key, ChecksumMode="ENABLED")
        except Exception as exc:
            if s3ops.missing(exc):
                problems.append(f"s3://{bucket}/{part.key}: named by a commit, missing")
                continue
            raise
        batch_bytes += part.size
        size = int(head.get("ContentLength", -1))
        b64 = head.get("ChecksumSHA256")
        sha = base64.b64decode(b64).hex() if b64 else None
        if size != part.size or (sha is not None and sha != part.sha256):
            problems.append(f"s3://{bucket}/{part.key}: {size} bytes, sha256 {sha}; its commit "
                            f"says {part.size} bytes, sha256 {part.sha256}")
        elif sha is None:
            problems.append(f"s3://{bucket}/{part.key}: the store keeps no SHA-256 for it")
    bytes_read = u.bytes_read
    deep_read = 0
    if deep > 0:
        rng = random.Random(seed)
        keys = sorted(seen)
        sample = keys if deep >= 1 else rng.sample(keys, max(1, round(deep * len(keys))))
        wanted: dict[str, set[tuple[int, int]]] = {}
        for c, part in u.parts():
            wanted.setdefault(part.key, set()).update((i, c.attempt) for i in expand(part.indices))
        for key in sample:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            bytes_read += len(body)
            deep_read += 1
            have = set()
            for raw in body.splitlines():
                try:
                    k = msgspec.json.decode(raw, type=_Keyed)
                except msgspec.DecodeError:
                    problems.append(f"s3://{bucket}/{key}: an unreadable line")
                    break
                have.add((k.index, k.attempt))
            lacking = wanted[key] - have
            if lacking:
                problems.append(f"s3://{bucket}/{key}: lacks {len(lacking)} lines its commits "
                                f"name (first index {min(lacking)[0]})")
    done = sum(1 for v in final.values() if v[1] == "done")
    return Verdict(ok=not problems, generations=len(u.chunks), chunks=total,
                   committed=committed, done=done, failed=len(final) - done,
                   batches=len(seen), batch_bytes=batch_bytes, bytes_read=bytes_read,
                   heads=heads, deep_read=deep_read, problems=problems)


def lines(client: Any, bucket: str, prefix: str) -> Iterator[tuple[int, bytes]]:
    """The campaign's data, for a consumer: (index, line) for each done index, from the
    batch its newest committing generation names; lines no commit names are left out."""
    u = read_union(client, bucket, prefix)
    if u.problems:
        raise ValueError("; ".join(u.problems[:5]))
    final = u.final()
    by_key: dict[str, set[tuple[int, int]]] = {}
    for c, part in u.parts():
        for i in expand(part.indices):
            if final[i][0] == c.generation:
                by_key.setdefault(part.key, set()).add((i, c.attempt))
    for key in sorted(by_key):
        want = by_key[key]
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        for raw in body.splitlines():
            k = msgspec.json.decode(raw, type=_Keyed)
            if (k.index, k.attempt) in want:
                yield k.index, raw


__all__ = ["Union", "Verdict", "commit_problem", "count", "lines", "read_union",
           "verify"]
