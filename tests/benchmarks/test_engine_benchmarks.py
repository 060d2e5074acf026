"""The engine's and the agent's benchmarks at a smoke size, each a process of its own, so that
none can silently break (their figures are for the report, not pass/fail). The console's are in
test_console_benchmarks.py and training's in test_train_benchmark.py: three files, so that
`pytest -n 4 --dist loadfile` spreads them over workers."""

from __future__ import annotations

import re

from tests.benchmarks.smoke import ratios, run_bench

NUM = r"(\d+(?:\.\d+)?)"


def test_dispatch() -> None:
    out = run_bench("dispatch.py", "--prompts", "200", "--servers", "2", "--concurrency", "8",
                    "--rounds", "1")
    ratios(out, rf"ratio engine/aiohttp CPU per completion: {NUM}x")
    ratios(out, rf"ratio engine/aiohttp completions/s: {NUM}x")


def test_scale() -> None:
    # 500 in flight on two simulators (1 simulated s = 0.28 s: 1,000 answers/s together), a
    # resume over 21,000 lines with 1,000 to do, and both clients through SGLang's router.
    out = run_bench("scale.py", "--in-flight", "500", "--servers", "2", "--rate", "1000",
                    "--prompts", "1000", "--resume-lines", "21000")
    ratios(out, rf"ratio engine/aiohttp CPU per completion at 500 in flight: {NUM}x")
    ratios(out, rf"ratio engine/aiohttp CPU per completion at 500 in flight through the "
                rf"router: {NUM}x")
    ratios(out, rf"worst loop stall: {NUM} ms by the clock \({NUM} ms of the loop's CPU and "
                rf"{NUM} ms waiting for a CPU in its 100 ms tick\); the engine's own \(the "
                rf"clock's less the wait\): {NUM} ms \(target <= 50 ms by the clock: ", count=4,
           positive=False)
    ratios(out, rf"resume over 21,000 lines: first request after {NUM} s", positive=False)
    ratios(out, rf"worst loop stall on the resume over 21,000 lines: {NUM} ms by the clock",
           positive=False)
    ratios(out, rf"less its wait for a CPU {NUM} ms", count=1, positive=False)
    # The servers stand for other machines: they must not take the clients' CPU.
    assert "simulators and router at nice 19" in out, out


def test_tail() -> None:
    # 1 simulated s = 2 ms: today's hung request holds its run ~7 s of wall time.
    out = run_bench("tail.py", "--prompts", "100", "--servers", "2", "--max-tokens", "64",
                    "--concurrency", "8", "--scale", "0.002", "--hang-rate", "0.01")
    ratios(out, rf"ratio time to 100%, deadlines \+ hedging / today: {NUM}x")
    # The last 1% with hedging can land within one poll: 0 (or n/a) is a fair figure here.
    assert "ratio 99% -> 100%, deadlines + hedging / today: " in out, out


def test_resume() -> None:
    out = run_bench("resume.py", "--n", "5000")
    assert "built 5,000 done indices in 10 batches" in out, out
    ratios(out, rf"ratio engine/naive: time {NUM}x, memory {NUM}x", count=2)


def test_autotune_simulated_and_live() -> None:
    # --real (SGLang itself) runs at a smoke size in tests/real/test_kv_pressure.py.
    out = run_bench("autotune.py", "--gpus", "2", "--hour-s", "300", "--live", "--live-s", "4")
    ratios(out, rf"settled auto / best fixed: fleet {NUM}, worst GPU {NUM}, median {NUM}; "
                rf"auto / default 40: fleet {NUM}", count=4)
    ratios(out, rf"5 simulated min from cold \(probing included\): auto / best fixed: worst "
                rf"{NUM}, median {NUM}", count=2)
    ratios(out, rf"auto / best fixed {NUM}; auto / default 40 {NUM}", count=2)


def test_agent() -> None:
    out = run_bench("agent.py", "--iterations", "200", "--requests", "20", "--ssh-runs", "3")
    # The snapshot's two, then two for each of the two RPC cases (no supervisor, live one).
    ratios(out, rf"ratio [^:\n]+:\s+{NUM}x", count=6)
    assert "supervised=False" in out and "supervised=True" in out, out


def test_queue_campaign() -> None:
    # 4 nodes, 8 simulators, a SeaweedFS; 1 simulated s = 10 ms (the slow node's 30 ms).
    out = run_bench("queue_campaign.py", "--prompts", "120", "--max-tokens", "16",
                    "--scale", "0.01", "--chunk-size", "10", "--batch-size", "5")
    ratios(out, rf"ratio time to done / ideal: {NUM}x")
    ratios(out, rf"backups: {NUM}; takeovers: {NUM}", count=2, positive=False)
    # HEADs only reads the commits, not the batches; deep reads every batch besides.
    (heads,) = ratios(out, rf"ratio verify bytes read / batch bytes: {NUM}x")
    (deep,) = ratios(out, rf"ratio verify deep=1.0 bytes read / batch bytes: {NUM}x")
    assert heads < 1 <= deep, out


def test_powerloss() -> None:
    """The torture at full size has a smoke size too (it needs FUSE, as tests/powerloss/
    does): a few cuts of pull's and the engine's recordings, every total exact."""
    out = run_bench("powerloss.py", "--cuts", "4", "--only", "pull,engine", "--per-kind", "1")
    found = re.search(r"(\d+) cuts in all, (\d+) lost, (\d+) doubled, every total exact", out)
    assert found is not None, out
    assert int(found.group(1)) > 0 and found.group(2) == found.group(3) == "0", out
