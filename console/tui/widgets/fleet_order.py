"""Which rows the fleet table shows and in what order: a sort by one of its columns (numbers
as numbers, a row without the figure last either way, ties in the fleet file's order) and a
filter by substring on a node's name, state and alerts. Figures are read from the node's
state and the campaign's rollup, not from the drawn cells: a row out of view is not built."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from console.queue.rollup import Rollup
from console.state import NodeState

T = TypeVar("T")
Value = float | str | None

# The columns a sort may use, in the order the sort key cycles through them (the table's).
SORTABLE = ("node", "role", "run", "status", "progress", "rate", "eta", "failed", "alerts",
            "contact")


@dataclass(frozen=True, slots=True)
class Order:
    column: str | None = None  # None: the fleet file's order
    reverse: bool = False
    filter: str = ""  # a substring, any case; "" shows every row

    def next_column(self) -> Order:
        """The next column to sort by; after the last, the fleet file's order again."""
        i = SORTABLE.index(self.column) + 1 if self.column is not None else 0
        return Order(SORTABLE[i] if i < len(SORTABLE) else None, False, self.filter)

    def reversed(self) -> Order:
        return Order(self.column or SORTABLE[0], not self.reverse, self.filter)


def node_value(ns: NodeState, column: str, now: float) -> Value:
    """What a node's row is sorted by in `column`; None: it has no such figure."""
    if column == "node":
        return ns.name.casefold()
    if column == "role":
        return ns.node.role
    if column == "contact":
        age = ns.age_s(now)
        # connected first, freshest first; then the others by link state
        return f"0 {age:012.3f}" if ns.link == "connected" and age is not None else f"1 {ns.link}"
    snap = ns.snapshot
    if snap is None:
        return None
    if column == "run":
        return snap.run.casefold()
    if column == "status":
        return snap.status
    if column == "alerts":
        critical = sum(1 for a in snap.alerts if a.severity == "critical")
        return len(snap.alerts) + critical / 1000  # as many: the one with critical ones after
    p, t = snap.progress, snap.train
    if p is not None:
        return {"progress": p.completed / p.total if p.total else None,
                "rate": p.rate_per_sec, "eta": p.eta_hours,
                "failed": float(p.failed)}.get(column)
    if t is not None:
        return {"progress": t.step / t.total_steps if t.total_steps else None,
                "rate": t.tokens_per_s, "eta": t.eta_hours}.get(column)
    return None


def campaign_value(r: Rollup, column: str) -> Value:
    """What a campaign's row is sorted by among the campaigns."""
    if column == "node":
        return r.campaign.casefold()
    if column == "role":
        return r.role
    if column == "status":
        return r.status
    if column == "alerts":
        return len(r.alerts) + r.critical / 1000
    if column == "progress":
        if r.role == "train":
            return r.step / r.total_steps if r.step is not None and r.total_steps else None
        return r.completed / r.total if r.answered and r.total else None
    if column == "rate":
        return r.rate_per_sec
    if column == "eta":
        return r.eta_hours
    if column == "failed":
        return float(r.failed) if r.role != "train" else None
    return None


def ordered(items: Sequence[T], value: Callable[[T], Value], reverse: bool) -> list[T]:
    """`items` by value, stable, those without one last in either direction."""
    known = [(v, item) for item in items if (v := value(item)) is not None]
    unknown = [item for item in items if value(item) is None]
    known.sort(key=lambda vi: vi[0], reverse=reverse)  # a column's values are of one type
    return [item for _, item in known] + unknown


def matches(ns: NodeState, text: str) -> bool:
    """The filter: `text` (any case) in the node's name, its link or run state, or an
    alert's code or message."""
    if not text:
        return True
    needle = text.casefold()
    snap = ns.snapshot
    hay = [ns.name, ns.link]
    if snap is not None:
        hay.append(snap.status)
        hay += [a.code for a in snap.alerts] + [a.message for a in snap.alerts]
    return any(needle in h.casefold() for h in hay)
