"""Acceptance drift, judged from the run's history store (agents/rundir/histstore.py) so that
a supervisor restart forgets nothing: each server's earlier level (the median of its accept
length over the run's first hours) and the fleet's recent level against the same."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from agents.rundir.spec import AlertsSection

MIN_BASELINE_S = 600.0  # a baseline shorter than this says nothing yet
MAX_NAMED = 8  # servers named in one fleet message


@dataclass(frozen=True, slots=True)
class AcceptLevels:
    """Accept lengths read from the history: per server (keys as in progress.servers)."""

    baseline: dict[str, float]  # the median over the run's first hours (the baseline window)
    recent: dict[str, float]  # the mean over the last accept_recent_minutes
    baseline_h: float  # how many hours the baseline covers
    recent_min: float

    def fleet(self) -> tuple[float, float, list[str]] | None:
        """The fleet's (baseline, recent) means over the servers known in both, and those."""
        names = sorted(set(self.baseline) & set(self.recent), key=_number)
        if not names:
            return None
        return (statistics.fmean(self.baseline[n] for n in names),
                statistics.fmean(self.recent[n] for n in names), names)


def _number(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isascii() and name.isdigit() else (1 << 30, name)


def _accepts(item: dict[str, Any]) -> dict[str, float]:
    srv = item.get("servers")
    out: dict[str, float] = {}
    if isinstance(srv, dict):
        for name, row in srv.items():
            v = row.get("accept_length") if isinstance(row, dict) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e6:
                out[str(name)] = float(v)
    return out


def accept_levels(items: list[dict[str, Any]], now: float, cfg: AlertsSection
                  ) -> AcceptLevels | None:
    """Levels from history items (oldest first, as `read_history` serves them): the baseline
    runs from the run's first sample for accept_baseline_hours, ending before the recent
    window; the recent window needs samples over at least half of it."""
    if not items:
        return None
    recent_s = cfg.accept_recent_minutes * 60
    first = items[0].get("first_at", items[0].get("updated_at"))
    if not isinstance(first, (int, float)):
        return None
    recent_from = now - recent_s
    base_end = min(first + cfg.accept_baseline_hours * 3600, recent_from)
    base: dict[str, list[float]] = {}
    recent: dict[str, list[tuple[float, int]]] = {}
    oldest_recent: dict[str, float] = {}
    for item in items:
        t = item.get("updated_at")
        if not isinstance(t, (int, float)):
            continue
        n = item.get("samples")
        weight = n if isinstance(n, int) and n > 0 else 1
        began = item.get("first_at", t)
        began = began if isinstance(began, (int, float)) else t
        for name, v in _accepts(item).items():  # whole buckets only, on either side
            if t <= base_end:
                base.setdefault(name, []).append(v)
            elif began > recent_from:
                recent.setdefault(name, []).append((v, weight))
                oldest_recent.setdefault(name, float(began))
    baseline = {name: statistics.median(vs) for name, vs in base.items()} \
        if base_end - first >= MIN_BASELINE_S else {}
    covered = {name: sum(v * w for v, w in got) / sum(w for _, w in got)
               for name, got in recent.items() if oldest_recent[name] <= now - recent_s / 2}
    return AcceptLevels(baseline, covered, round(max(0.0, base_end - first) / 3600, 1),
                        cfg.accept_recent_minutes)


def fleet_drift(levels: AcceptLevels | None, cfg: AlertsSection) -> str | None:
    """Why the fleet's accept length is judged to have fallen, or None: its recent mean under
    accept_fleet_drop of its baseline; the message names each server with its two figures,
    the one that fell most first."""
    fleet = levels.fleet() if levels is not None else None
    if levels is None or fleet is None or cfg.accept_fleet_drop <= 0:
        return None
    base, now, names = fleet
    if base <= 0 or now > cfg.accept_fleet_drop * base:
        return None
    names.sort(key=lambda n: levels.recent[n] / levels.baseline[n] if levels.baseline[n]
               else 1.0)
    shown = ", ".join(f"server {n} {levels.baseline[n]:.2f} → {levels.recent[n]:.2f}"
                      for n in names[:MAX_NAMED])
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return (f"accept length fell {1 - now / base:.0%} across the fleet: {now:.2f} over the "
            f"last {levels.recent_min:g} min against {base:.2f} over the run's first "
            f"{levels.baseline_h:g} h ({shown}{more}): a drafter or model change, or prompts "
            "unlike the first ones")


def server_drop(number: int, acc: float, levels: AcceptLevels | None, run_avg: float | None,
                cfg: AlertsSection) -> str | None:
    """Why server `number`'s accept length `acc` (its live figure) is judged low, or None:
    under accept_drop of its own earlier level from the history, or (no history yet) of the
    fleet's run average."""
    own = levels.baseline.get(str(number)) if levels is not None else None
    if own is not None and own > 0:
        if acc < cfg.accept_drop * own:
            assert levels is not None
            return (f"server {number}: accept length {acc:.2f} is {1 - acc / own:.0%} below "
                    f"its own {own:.2f} over the run's first {levels.baseline_h:g} h")
        return None
    fleet = levels.fleet() if levels is not None else None
    baseline = fleet[0] if fleet is not None else run_avg
    if baseline is not None and acc < cfg.accept_drop * baseline:
        return (f"server {number}: accept length {acc:.2f} is well below the run's average "
                f"{baseline:.2f}")
    return None
