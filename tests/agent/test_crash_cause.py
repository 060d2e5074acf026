"""The crash-cause reader on log tails of failed start-ups recorded from the real SGLang (and a
few rendered where no GPU could make them): tests/fixtures/crash_tails/SOURCES.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.rundir.schema import EXIT_CAUSES
from agents.supervise.crashcause import KINDS, classify, read_tail
from agents.supervise.sglang_log import LAUNCH_MARKER

TAILS = Path(__file__).resolve().parents[1] / "fixtures" / "crash_tails"
EXPECTED = json.loads((TAILS / "expected.json").read_text())


@pytest.mark.parametrize("sample", sorted(EXPECTED))
def test_each_recorded_tail_names_its_cause(sample: str) -> None:
    want = EXPECTED[sample]
    cause = classify(read_tail(TAILS / sample))
    assert cause is not None, sample
    assert cause.kind == want["kind"], (sample, cause)
    if want["line"] is not None:
        assert cause.line == want["line"]
    else:
        assert cause.line.startswith(want["line_starts"]), cause.line
    # The sample's own text, not a summary: what a person greps the log for.
    assert cause.line.rstrip("…") in (TAILS / sample).read_text()


def test_every_kind_is_named_and_covered() -> None:
    assert set(KINDS) == set(EXIT_CAUSES)
    # Every kind but the two that need a real server's later stages has a recorded sample.
    assert {w["kind"] for w in EXPECTED.values()} == set(KINDS) - {"bad_argument"}
    deterministic = {k for k, (det, _) in KINDS.items() if det}
    assert deterministic == {"unknown_argument", "bad_argument", "missing_model"}


def test_only_the_latest_start_is_read(tmp_path: Path) -> None:
    """Each start appends to the same log after a launch marker: an out-of-memory of an
    earlier start says nothing of why this one exited."""
    log = tmp_path / "sglang_gpu0.log"
    oom = (TAILS / "rendered_sglang-0.5.23_cuda_oom_at_load.log").read_bytes()
    argv = (TAILS / "sglang-0.5.23_unknown_argument.log").read_bytes()
    marker = f"\n{LAUNCH_MARKER} at ".encode()  # as servers.py writes it
    log.write_bytes(marker + b"2026-12-06 03:12:40\n" + oom
                    + marker + b"2026-12-06 03:13:10\n" + argv)
    cause = classify(read_tail(log))
    assert cause is not None and cause.kind == "unknown_argument"
    log.write_bytes(log.read_bytes() + marker + b"2026-12-06 03:14:00\n")
    assert classify(read_tail(log)) is None  # the newest start has said nothing yet
    assert read_tail(tmp_path / "never_written.log") == ""


def test_bad_values_and_missing_flags_are_argument_errors() -> None:
    """argparse's other errors, from the simulator's own parser (it takes SGLang's flags)."""
    for args, kind in ((["--tp-size", "two"], "bad_argument"),
                       (["--fail-start"], "bad_argument"),
                       (["--enable-metrcs"], "unknown_argument")):
        r = subprocess.run([sys.executable, "-m", "agents.sim", *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        cause = classify(r.stderr)
        assert cause is not None and cause.kind == kind, (args, r.stderr[-300:])
        assert cause.line == r.stderr.strip().splitlines()[-1]


def test_what_is_not_a_crash_cause() -> None:
    # SGLang before 0.5 logs this when it retracts requests: a full KV pool, not an exit.
    assert classify("[2024-08-31 10:00:01 TP0] Decode out of memory happened. "
                    "#retracted_reqs: 1, #new_token_ratio: 0.4482 -> 1.0000\n") is None
    assert classify("[2026-12-01 22:57:02] The server is fired up and ready to roll!\n") is None
    assert classify("") is None
    # SGLang's "look above" line is never the cause when the lines above name one.
    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "KeyError: 'rope_scaling'\n"
            "RuntimeError: Initialization failed. Please see the error messages above.\n")
    cause = classify(tail)
    assert cause is not None and cause.line == "KeyError: 'rope_scaling'"


def test_an_old_exception_is_not_why_a_long_running_server_died() -> None:
    """A traceback logged while serving, then hours of batch lines, then a SIGKILL (which
    prints nothing): no cause, rather than a wrong one."""
    decode = ("[2026-12-06 01:00:00] Decode batch, #running-req: 40, #token: 81234, token "
              "usage: 0.41, cuda graph: True, gen throughput (token/s): 2210.51, "
              "#queue-req: 0\n")
    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "ValueError: a request's own error\n")
    assert classify(tail + decode * 199) is not None
    assert classify(tail + decode * 200) is None


def test_a_long_line_is_cut_and_the_prefix_dropped() -> None:
    cause = classify("[2026-12-06 03:12:53 TP3] ValueError: " + "x" * 5000 + "\n")
    assert cause is not None and cause.kind == "exception"
    assert cause.line.startswith("ValueError: xxx") and len(cause.line) == 400
    assert cause.text().startswith("exception: ValueError: ")
