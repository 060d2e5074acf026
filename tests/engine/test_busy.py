"""A server that says "later" is busy, not broken: SGLang 0.5.23 answers 503 "The request queue
is full." past --max-queued-requests (recorded from the real server in
tests/fixtures/sglang/real-0.5.23/errors/), and 429 or a Duplicate request ID while it still
holds a rid. Before, that 503 counted as a server fault (three in a row set a healthy server
aside) and as one of the request's tries (a prompt could fail for good on a busy server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.engine.client import RequestFailed, parse_response
from tests.engine.runs import read_run, start_engine, wait_progress, write_prompts, write_spec
from tests.simserver import FAST_ARGS, start_sim

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "real-0.5.23" / "errors"


@pytest.mark.parametrize("name", ["chat_queue_full.json", "generate_queue_full.json"])
def test_the_real_servers_queue_full_answer_is_busy_not_a_fault(name: str) -> None:
    recorded = json.loads((REAL / name).read_text())
    with pytest.raises(RequestFailed) as caught:
        parse_response(recorded["status"], json.dumps(recorded["body"]).encode(), 0.01)
    exc = caught.value
    assert (exc.error, exc.busy, exc.retryable, exc.server_fault) == ("http_503", True, True,
                                                                      False)


def test_any_other_5xx_is_still_the_servers_fault() -> None:
    with pytest.raises(RequestFailed) as caught:
        parse_response(503, b'{"message": "Service Unavailable"}', 0.01)
    assert caught.value.server_fault and not caught.value.busy
    with pytest.raises(RequestFailed) as caught:
        parse_response(500, b"Internal Server Error", 0.01)
    assert caught.value.server_fault and not caught.value.busy


def test_a_run_on_a_server_whose_queue_is_full_loses_nothing_and_uses_no_tries(
        tmp_path: Path) -> None:
    # Two running and two waiting at most, twelve sent: most sends are refused at first.
    sim = start_sim(tmp_path, *FAST_ARGS, "--max-running-requests", "2",
                    "--max-queued-requests", "2")
    try:
        write_prompts(tmp_path / "prompts.jsonl", 60)
        spec = write_spec(tmp_path / "run.toml", tmp_path / "prompts.jsonl", [sim.url],
                          concurrency_per_server=12, retries=1, max_tokens=64,
                          server_failures_to_down=2)
        engine = start_engine(spec)
        p = wait_progress(engine, lambda p: p["status"] in ("done", "failed"), 300,
                          "the run's end")
        assert engine.wait(60) == 0, engine.stderr()
        assert p["status"] == "done", p.get("message")
        assert p["busy_answers"] > 0, "the queue limit never refused a request"
        assert p["failed"] == 0 and p["retried"] == 0, p
        st = read_run(engine.run_dir)
        assert set(st.current) == set(range(60)) and not st.failed
        assert "set aside" not in engine.stderr(), "a busy server was set aside as failing"
    finally:
        sim.kill()
