"""`fleetdeck status` without --json: one line a node with the ETA's p10-p90 band and the
money (at the fleet file's price when it sets one), and an alert's actions by id."""

from __future__ import annotations

from console.fleet import Node
from console.headless import NodeStatus, _human
from tests.console import data as d


def test_the_status_line_has_the_band_the_cost_and_the_actions() -> None:
    snap = d.generate_snapshot(alerts=[{
        "code": "idle", "severity": "warning", "since": d.NOW - 1800,
        "message": "GPUs idle on gpu-box-7 — pull and decommission",
        "actions": ["pull", "decommission"]}])
    entry = NodeStatus.answered("gen-1", snap)
    line = _human(entry, Node(name="gen-1", run_dir="/r", host="h"))
    assert "ETA 8.94 h (p10-p90 7.81-10.62 h), $151.89 so far (~$307.72 at the end)" in line
    assert "ALERT warning: GPUs idle on gpu-box-7 — pull and decommission [pull, decommission]" \
        in line
    # The fleet file's price for this node: 61 GPU-h x $4 = $244; projected + 7 x 8.94 h x $4.
    priced = _human(entry, Node(name="gen-1", run_dir="/r", host="h", cost_per_gpu_hour=4.0))
    assert "$244.00 so far (~$494.32 at the end)" in priced


def test_resize_takes_auto_or_a_number() -> None:
    import pytest

    from console.cli import build_parser
    from console.headless import VERB_PARAMS

    parser = build_parser()
    for value, sent in (("auto", "auto"), ("12", 12)):
        args = parser.parse_args(["resize", "gen-1", value, "--server", "2"])
        assert VERB_PARAMS["resize"](args) == {"value": sent, "server": 2}
    with pytest.raises(SystemExit):
        parser.parse_args(["resize", "gen-1", "fast"])


def test_the_status_line_says_tail_with_the_hedges() -> None:
    snap = d.generate_snapshot()
    line = _human(NodeStatus.answered("gen-1", snap), None)
    assert "tail" not in line
    snap["progress"].update(tail=True, hedges=12, hedges_won=5)
    line = _human(NodeStatus.answered("gen-1", snap), None)
    assert "tail: 12 hedged, 5 won by the copy" in line


def test_the_status_line_says_what_the_node_paged_and_what_it_lost() -> None:
    snap = d.generate_snapshot(
        alerts=[{"code": "stall", "severity": "critical", "since": d.NOW - 60,
                 "message": "no completion in the whole run for 11.0 min", "paged": True}],
        pager={"format": "slack", "posted": 4, "pages": 9, "pending": 2, "dropped": 3,
               "failures": 7, "last_error": "the receiver answered 503; retrying"})
    line = _human(NodeStatus.answered("gen-1", snap))
    assert "ALERT critical: no completion in the whole run for 11.0 min (paged by the node)" \
        in line
    assert "pages (slack webhook): 4 posted, 2 waiting, 3 dropped; last error: the receiver " \
        "answered 503; retrying" in line
    # No webhook on the node: no pages line, no paged mark.
    plain = _human(NodeStatus.answered("gen-1", d.generate_snapshot()))
    assert "pages" not in plain and "paged" not in plain


def test_the_status_line_splits_the_truncated_into_loops_and_long() -> None:
    """Loops gain nothing from a retry: the line says how many there are, and the retry verb
    takes --long-only to send only the others."""
    from console.cli import build_parser
    from console.headless import VERB_PARAMS

    snap = d.generate_snapshot()
    snap["progress"].update(truncated=81_216, truncated_loops=60_112)
    line = _human(NodeStatus.answered("gen-1", snap), Node(name="gen-1", run_dir="/r", host="h"))
    assert "failed, truncated 81216 (loops 60112, long 21104), " in line
    snap["progress"].update(truncated=0, truncated_loops=0)
    line = _human(NodeStatus.answered("gen-1", snap), Node(name="gen-1", run_dir="/r", host="h"))
    assert "truncated" not in line
    parser = build_parser()
    args = parser.parse_args(["retry", "gen-1", "truncated", "--long-only"])
    assert VERB_PARAMS["retry"](args) == {"what": "truncated", "long_only": True}
    assert VERB_PARAMS["retry"](parser.parse_args(["retry", "gen-1", "truncated"])) == \
        {"what": "truncated"}
