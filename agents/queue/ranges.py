"""Sets of indices as sorted, disjoint half-open `[start, stop)` pairs: compact for the
contiguous chunks of generation 0 and still exact for the scattered ones of a retry."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

Ranges = list[tuple[int, int]]


def to_ranges(indices: Iterable[int]) -> Ranges:
    """Indices (any order, repeats allowed) as ranges."""
    out: Ranges = []
    for i in sorted(set(indices)):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def expand(ranges: Iterable[tuple[int, int]]) -> Iterator[int]:
    for start, stop in ranges:
        yield from range(start, stop)


def count(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(stop - start for start, stop in ranges)


def well_formed(ranges: Iterable[tuple[int, int]], size: int) -> str | None:
    """Why these are not sorted, disjoint, non-empty ranges inside 0..size, or None."""
    last = -1
    for pair in ranges:
        if len(pair) != 2:
            return f"{pair!r} is not a [start, stop) pair"
        start, stop = pair
        if not (isinstance(start, int) and isinstance(stop, int)):
            return f"{pair!r} is not a pair of integers"
        if not 0 <= start < stop <= size:
            return f"[{start}, {stop}) is empty or outside 0..{size}"
        if start < last:
            return f"[{start}, {stop}) overlaps or is out of order"
        last = stop
    return None


def text(ranges: Ranges, limit: int = 8) -> str:
    """`3-9, 12, 40-41` (inclusive, as people read them), at most `limit` pieces."""
    parts = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in ranges[:limit]]
    more = len(ranges) - limit
    return ", ".join(parts) + (f" and {more} more ranges" if more > 0 else "")
