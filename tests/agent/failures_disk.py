"""failures.jsonl counted straight from its lines (json, not agents/rundir/failsummary.py), and
a summary checked against that count: the tests of the failures view judge it by the disk."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from agents.rundir.schema import FailureSummary


def expected(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The journal's figures counted straight from its lines (json, not the summarizer)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        ev = json.loads(raw)
        if ev["event"] == "retry":
            continue
        key = (ev["event"], ev.get("error") if ev["event"] == "failed" else ev.get("what"))
        g = out.setdefault(key, {"count": 0, "times": [], "servers": Counter(),
                                 "no_server": 0, "lines": []})
        g["count"] += 1
        g["times"].append(ev["time"])
        if ev.get("server") is None:
            g["no_server"] += 1
        else:
            g["servers"][ev["server"]] += 1
        g["lines"].append((lineno, raw))
    return out


def assert_matches_disk(got: FailureSummary, path: Path) -> None:
    want = expected(path)
    assert {(g.event, g.error) for g in got.groups} == set(want)
    assert got.events == sum(g["count"] for g in want.values())
    assert got.unreadable == 0 and got.other == 0
    assert [g.count for g in got.groups] == sorted((g.count for g in got.groups), reverse=True)
    for g in got.groups:
        w = want[(g.event, g.error)]
        assert g.count == w["count"], (g.event, g.error)
        assert (g.first, g.last) == (min(w["times"]), max(w["times"]))
        assert {s.server: s.count for s in g.servers} == dict(w["servers"])
        assert g.no_server == w["no_server"] and g.servers_more == 0
        lines = w["lines"]
        picked = [lines[0], *lines[1:][-2:]]  # the first, and the latest two
        assert [(e.line, e.text) for e in g.examples] == picked
