"""A retry generation: after `max-tokens` (the truncation playbook) or for failures,
generation G+1 is cut over exactly the indices the commits so far mark truncated or failed
(bad input left out: it fails the same way again). Nodes claim its chunks like any others;
the union takes each index from its highest committed generation. One retry at a time: a
new one waits until the last is committed in full, so no index is in two unfinished ones."""

from __future__ import annotations

import time
from typing import Any, Literal

from agents.queue import records as rec
from agents.queue import s3ops
from agents.queue.chunks import cut
from agents.queue.layout import Layout
from agents.queue.ranges import count, expand, to_ranges
from agents.queue.union import read_union


class RetryRefused(RuntimeError):
    pass


def new_generation(client: Any, bucket: str, prefix: str, why: Literal["failed", "truncated"],
                   max_tokens: int | None, by: str) -> rec.Generation | None:
    """Generation G+1's record, created where none is; None when nothing is to retry."""
    u = read_union(client, bucket, prefix)
    if u.problems:
        raise RetryRefused("the commits do not hold together: " + "; ".join(u.problems[:3]))
    top = max(u.chunks)
    if top > 0 and len(u.commits[top]) < u.chunks[top]:
        raise RetryRefused(f"generation {top} (a retry) has {u.chunks[top] - len(u.commits[top])}"
                           f" of {u.chunks[top]} chunks not yet committed: retry again once it "
                           "is done")
    final = u.final()
    picked: list[int] = []
    by_gen: dict[int, rec.Commit] = {}
    for g in sorted(u.commits):
        for c in u.commits[g].values():
            ranges = c.truncated if why == "truncated" else c.failed
            bad = set(expand(c.bad_input)) if why == "failed" else set()
            for i in expand(ranges):
                if final[i][0] == g and i not in bad:
                    picked.append(i)
                    by_gen[i] = c
    if not picked:
        return None
    gen = rec.Generation(generation=top + 1, why=why,
                         chunks=cut(to_ranges(picked), u.pin.chunk_size),
                         max_tokens=max_tokens, created_at=time.time(), created_by=by)
    key = Layout(prefix).gen_record(gen.generation)
    if s3ops.create(client, bucket, key, rec.encode(gen)) is None:
        raise RetryRefused(f"s3://{bucket}/{key}: generation {gen.generation} was created by "
                           "someone else a moment ago")
    return gen


def described(gen: rec.Generation) -> str:
    n = sum(count(c) for c in gen.chunks)
    at = f" at max_tokens {gen.max_tokens}" if gen.max_tokens else ""
    return (f"generation {gen.generation}: {n} {gen.why} indices in {len(gen.chunks)} chunks"
            f"{at}")
