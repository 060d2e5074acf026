"""The TUI's garbage-collector policy: what start-up made is frozen out of the collector's
sight, and collections come rarer. A status snapshot a second per node allocates tens of
thousands of objects a second that die young by reference counting, not by collection; the
full collections that followed walked Textual's widgets and render caches (a 31 ms pause
every ~10 s at 128 nodes, the worst redraw tick of benchmarks/tui.py). Cycles are still
collected, less often."""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between young collections (Python's default: 700)
FULL_EVERY = 100  # middle collections between full ones (default: 10)


def quiet_gc() -> None:
    """Once the app is up. The process's own setting: the TUI is the process's only work."""
    gc.collect()
    gc.freeze()
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, FULL_EVERY)
