"""The queue's S3 side, blocking (the engine calls it from a thread): the campaign's pin, its
generations, and each chunk's lease, backup and commit. Nothing here decides what to work
on; it answers what the prefix holds and makes the conditional writes."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.chunks import Chunk, first_generation
from agents.queue.layout import Layout, chunk_of_key
from agents.queue.ranges import well_formed

log = logging.getLogger("fleetdeck.queue")


class BoardError(RuntimeError):
    """The prefix holds something this node must not work against, named."""


@dataclass(frozen=True)
class Me:
    node: str
    run_id: str


@dataclass
class GenState:
    """One generation as a listing showed it (the store's clock in `now`)."""

    generation: int
    chunks: list[Chunk]
    committed: set[int] = field(default_factory=set)
    leases: dict[int, s3ops.Listed] = field(default_factory=dict)
    backups: set[int] = field(default_factory=set)
    now: float = 0.0

    def free(self) -> list[Chunk]:
        return [c for c in self.chunks if c.number not in self.committed
                and c.number not in self.leases]

    def open(self) -> list[Chunk]:
        return [c for c in self.chunks if c.number not in self.committed]


@dataclass
class Held:
    """A lease this node holds (or a backup it runs: no lease, `etag` None)."""

    chunk: Chunk
    epoch: int
    etag: str | None
    claimed_at: float
    backup: bool = False


class Board:
    def __init__(self, client: Any, bucket: str, prefix: str, me: Me, lease_s: float,
                 skew_s: float) -> None:
        self.client = client
        self.bucket = bucket
        self.layout = Layout(prefix)
        self.me = me
        self.lease_s = lease_s
        self.skew_s = skew_s
        self._gens: dict[int, list[Chunk]] = {}
        self._took: dict[tuple[int, int], float] = {}

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    # -- the campaign ------------------------------------------------------------------------

    def pin(self, mine: rec.CampaignPin) -> rec.CampaignPin:
        """The campaign's pin: ours put where none is, else the one there, which must mean
        the same (the same prompts, chunk size, model and sampling)."""
        pin = self._pin(mine)
        self._gens.setdefault(0, first_generation(pin.prompts_lines, pin.chunk_size))
        return pin

    def _pin(self, mine: rec.CampaignPin) -> rec.CampaignPin:
        key = self.layout.pin
        for _ in range(3):
            got = s3ops.read(self.client, self.bucket, key)
            if got is not None:
                there: rec.CampaignPin = rec.decode(rec.CampaignPin, got[0], self.url(key))
                differ = [f for f in ("campaign", "prompts_sha256", "prompts_lines", "chunk_size",
                                      "model", "sampling", "chat_template_kwargs")
                          if getattr(there, f) != getattr(mine, f)]
                if differ:
                    raise BoardError(
                        f"{self.url(key)} pins campaign {there.campaign!r} with "
                        + ", ".join(f"{f} {getattr(there, f)!r}" for f in differ)
                        + "; this node's spec has "
                        + ", ".join(f"{f} {getattr(mine, f)!r}" for f in differ)
                        + ": every node of a campaign runs the same prompts and settings")
                return there
            if s3ops.create(self.client, self.bucket, key, rec.encode(mine)) is not None:
                return mine
        raise BoardError(f"{self.url(key)}: neither readable nor writable")

    def join(self, host: str) -> None:
        member = rec.Member(node=self.me.node, run_id=self.me.run_id, joined_at=time.time(),
                            host=host)
        self.client.put_object(Bucket=self.bucket, Key=self.layout.member(self.me.node),
                               Body=rec.encode(member), ContentType="application/json")
        # Working again: a given-back record of this node's no longer holds.
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.layout.given_back(self.me.node))
        except Exception as exc:  # absent is the usual case
            if not s3ops.missing(exc):
                raise

    def generations(self, pin: rec.CampaignPin) -> list[int]:
        """Every generation there is: 0, and each retry's record."""
        out = [0]
        self._gens.setdefault(0, first_generation(pin.prompts_lines, pin.chunk_size))
        for key in s3ops.keys(self.client, self.bucket, self.layout.gens):
            name = key.rsplit("/", 1)[-1]
            if not (name.startswith("gen-") and name.endswith(".json")):
                continue
            try:
                g = int(name[4:-5])
            except ValueError:
                continue
            if g not in self._gens:
                self._gens[g] = self._load_gen(g, pin)
            out.append(g)
        return sorted(set(out))

    def _load_gen(self, g: int, pin: rec.CampaignPin) -> list[Chunk]:
        key = self.layout.gen_record(g)
        got = s3ops.read(self.client, self.bucket, key, limit=64 << 20)
        if got is None:
            raise BoardError(f"{self.url(key)}: listed but gone")
        gen: rec.Generation = rec.decode(rec.Generation, got[0], self.url(key))
        if gen.generation != g:
            raise BoardError(f"{self.url(key)}: says generation {gen.generation}")
        chunks = []
        for n, ranges in enumerate(gen.chunks):
            bad = well_formed(ranges, pin.prompts_lines)
            if bad is not None:
                raise BoardError(f"{self.url(key)}: chunk {n}: {bad}")
            chunks.append(Chunk(g, n, [tuple(r) for r in ranges]))  # type: ignore[misc]
        return chunks

    def generation(self, g: int) -> rec.Generation | None:
        got = s3ops.read(self.client, self.bucket, self.layout.gen_record(g), limit=64 << 20)
        return None if got is None else rec.decode(rec.Generation, got[0],
                                                   self.url(self.layout.gen_record(g)))

    def chunks(self, g: int) -> list[Chunk]:
        return self._gens[g]

    def state(self, g: int) -> GenState:
        st = GenState(g, self._gens[g])
        commits, _ = s3ops.listing(self.client, self.bucket, self.layout.commits(g))
        st.committed = {n for item in commits if (n := chunk_of_key(item.key)) is not None}
        leases, st.now = s3ops.listing(self.client, self.bucket, self.layout.leases(g))
        st.leases = {n: item for item in leases if (n := chunk_of_key(item.key)) is not None}
        backups, _ = s3ops.listing(self.client, self.bucket, self.layout.backups(g))
        st.backups = {n for item in backups if (n := chunk_of_key(item.key)) is not None}
        return st

    # -- leases ------------------------------------------------------------------------------

    def _lease_body(self, epoch: int, claimed_at: float, released: bool = False) -> bytes:
        lease = rec.Lease(node=self.me.node, run_id=self.me.run_id, epoch=epoch,
                          claimed_at=claimed_at, renewed_at=time.time(),
                          lease_s=0.0 if released else self.lease_s)
        return rec.encode(lease)

    def claim(self, chunk: Chunk) -> Held | None:
        """A free chunk's lease, created where none is; None when another node was first."""
        now = time.time()
        etag = s3ops.create(self.client, self.bucket,
                            self.layout.lease(chunk.generation, chunk.number),
                            self._lease_body(1, now))
        return None if etag is None else Held(chunk, 1, etag, now)

    def expired(self, st: GenState, number: int) -> bool:
        """Past its expiry on the store's clock (its last write plus its term), with the
        clock-skew margin; a released lease (term 0) at once."""
        item = st.leases[number]
        return item.last_modified + self.lease_s + self.skew_s < st.now

    def read_lease(self, chunk: Chunk) -> tuple[rec.Lease, str] | None:
        key = self.layout.lease(chunk.generation, chunk.number)
        got = s3ops.read(self.client, self.bucket, key)
        if got is None:
            return None
        return rec.decode(rec.Lease, got[0], self.url(key)), got[1]

    def running_s(self, st: GenState, number: int) -> tuple[rec.Lease, float] | None:
        """A leased chunk's lease and how long its epoch has run, on the store's clock: the
        holder's `claimed_at` moved by the holder's offset from the store, seen on the same
        write (`renewed_at` against the object's Last-Modified). None when the lease changed
        since the listing `st` (or is gone): judge it on the next look."""
        got = self.read_lease(self.chunks(st.generation)[number])
        item = st.leases.get(number)
        if got is None or item is None or got[1] != item.etag:
            return None
        lease = got[0]
        offset = item.last_modified - lease.renewed_at
        return lease, st.now - (lease.claimed_at + offset)

    def take_over(self, chunk: Chunk, st: GenState | None = None) -> Held | None:
        """A lease past its expiry (or released), replaced with If-Match: the epoch grows.
        None when it was renewed, taken or committed meanwhile."""
        got = self.read_lease(chunk)
        if got is None:
            return None
        lease, etag = got
        if st is not None and etag != st.leases[chunk.number].etag:
            return None  # renewed (or taken) since the listing judged it
        released = lease.lease_s == 0.0
        if not released and st is not None and not self.expired(st, chunk.number):
            return None
        if self.committed(chunk):
            return None
        now = time.time()
        new = s3ops.replace(self.client, self.bucket,
                            self.layout.lease(chunk.generation, chunk.number),
                            self._lease_body(lease.epoch + 1, now), etag)
        if new is None:
            return None
        log.info("took over chunk %s from %s (epoch %d -> %d%s)", chunk.name, lease.node,
                 lease.epoch, lease.epoch + 1, ", released" if released else ", expired")
        return Held(chunk, lease.epoch + 1, new, now)

    def resume(self, chunk: Chunk, backup: bool, claimed_at: float) -> Held | None:
        """After a restart: a lease still ours (this node and run), renewed at once; None
        when it is gone to another node or committed."""
        if self.committed(chunk):
            return None
        if backup:
            return Held(chunk, 0, None, claimed_at, backup=True)
        got = self.read_lease(chunk)
        if got is None or (got[0].node, got[0].run_id) != (self.me.node, self.me.run_id):
            return None
        held = Held(chunk, got[0].epoch, got[1], got[0].claimed_at)
        return held if self.renew(held) else None

    def renew(self, held: Held) -> bool:
        """Renewed with If-Match on our ETag; False when the lease is no longer ours."""
        assert held.etag is not None
        new = s3ops.replace(self.client, self.bucket,
                            self.layout.lease(held.chunk.generation, held.chunk.number),
                            self._lease_body(held.epoch, held.claimed_at), held.etag)
        if new is None:
            return False
        held.etag = new
        return True

    def release(self, held: Held) -> None:
        """A clean stop: the lease marked released, so another node takes it at once."""
        if held.etag is None:
            return
        s3ops.replace(self.client, self.bucket,
                      self.layout.lease(held.chunk.generation, held.chunk.number),
                      self._lease_body(held.epoch, held.claimed_at, released=True), held.etag)

    def backup(self, chunk: Chunk, holder: str) -> Held | None:
        """This node as the chunk's one backup; None when it has one."""
        body = rec.encode(rec.Backup(node=self.me.node, run_id=self.me.run_id, at=time.time(),
                                     holder=holder))
        if s3ops.create(self.client, self.bucket,
                        self.layout.backup(chunk.generation, chunk.number), body) is None:
            return None
        return Held(chunk, 0, None, time.time(), backup=True)

    # -- commits -----------------------------------------------------------------------------

    def committed(self, chunk: Chunk) -> bool:
        return s3ops.exists(self.client, self.bucket,
                            self.layout.commit(chunk.generation, chunk.number))

    def read_commit(self, g: int, n: int) -> rec.Commit | None:
        key = self.layout.commit(g, n)
        got = s3ops.read(self.client, self.bucket, key, limit=64 << 20)
        return None if got is None else rec.decode(rec.Commit, got[0], self.url(key))

    def commit(self, commit: rec.Commit) -> tuple[bool, rec.Commit | None]:
        """(True, None) when this commit is the chunk's; (False, the one there) when another
        was first. The same commit again (ours, put before a crash took its answer) is ours."""
        key = self.layout.commit(commit.generation, commit.chunk)
        if s3ops.create(self.client, self.bucket, key, rec.encode(commit)) is not None:
            return True, None
        there = self.read_commit(commit.generation, commit.chunk)
        if there is not None and (there.node, there.run_id) == (self.me.node, self.me.run_id):
            return True, None
        return False, there

    def remember(self, c: rec.Commit) -> None:
        """A commit read (or made) elsewhere: how long it took, so durations need not read
        it again."""
        self._took.setdefault((c.generation, c.chunk), c.committed_at - c.started_at)

    def durations(self, g: int, sample: int = 25) -> list[float]:
        """How long the newest commits of a generation took, from claim to commit (each read
        once: a commit never changes)."""
        items, _ = s3ops.listing(self.client, self.bucket, self.layout.commits(g))
        items.sort(key=lambda i: i.last_modified)
        out = []
        for item in items[-sample:]:
            n = chunk_of_key(item.key)
            if n is None:
                continue
            if (g, n) not in self._took:
                c = self.read_commit(g, n)
                self._took[(g, n)] = (c.committed_at - c.started_at) if c is not None else -1.0
            if self._took[(g, n)] >= 0:
                out.append(self._took[(g, n)])
        return out
