"""The run panel's error lines name the node's pager in trouble: pages waiting on a receiver
that is down, or lost past the queue's bound; nothing while it posts fine."""

from __future__ import annotations

import json

from agents.rundir.schema import snapshot_decoder
from console.tui.widgets.run_panel import latest_errors
from tests.console import data as d


def test_the_run_panel_names_pages_that_wait_or_were_lost() -> None:
    def errors(pager: dict | None) -> list[str]:
        return latest_errors(snapshot_decoder.decode(json.dumps(
            d.generate_snapshot(pager=pager))))

    trouble = {"format": "ntfy", "pending": 5, "dropped": 2,
               "last_error": "ConnectError: All connection attempts failed; retrying"}
    assert errors(trouble)[0] == ("pages: 5 waiting, 2 dropped: ConnectError: All connection "
                                  "attempts failed; retrying")
    # Posting fine (or nothing to post): no line.
    assert not [e for e in errors({"format": "slack", "posted": 3}) if e.startswith("pages")]
    assert not [e for e in errors(None) if e.startswith("pages")]
