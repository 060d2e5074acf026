"""What `retry truncated` sends again: current lines (the highest attempt of an index) that
stopped at a max_tokens below today's; with --long-only, not those that ended in a loop."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agents.engine.doneset import DoneSet
from agents.rundir.batchnames import batch_files


class _LineFields(msgspec.Struct):
    index: int
    finish_reason: str
    max_tokens: int = 0
    attempt: int = 1

def _bit(bits: bytearray, index: int) -> bool:
    byte = index >> 3
    try:
        return bool(bits[byte] & (1 << (index & 7)))
    except IndexError:  # past the bits: no line of it counted here yet
        return False


def find_truncated(folder: Path, done: DoneSet, inflight: set[int],
                   max_tokens: int, looped: bytearray | None = None) -> list[tuple[int, int]]:
    """(index, attempt) of current lines that hit a max_tokens below `max_tokens`; with
    `looped` (Totals.looped: a bit per index whose current line is a loop), the others."""
    decoder = msgspec.json.Decoder(_LineFields)
    found = []
    for batch in batch_files(folder):
        try:
            f = open(batch, "rb")  # noqa: SIM115 - closed by the with below
        except FileNotFoundError:
            # The open batch closed (renamed) since the listing: read it under its new name.
            f = open(batch.with_suffix(""), "rb")  # noqa: SIM115
        with f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # the writer is mid-line in the open batch
                line = decoder.decode(raw)
                if (line.finish_reason == "length" and line.max_tokens < max_tokens
                        and done.attempt(line.index) == line.attempt
                        and line.index not in inflight
                        and not (looped is not None and _bit(looped, line.index))):
                    found.append((line.index, line.attempt))
    return found
