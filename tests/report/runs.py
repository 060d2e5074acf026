"""A finished run with a history worth plotting: the real engine over two simulated servers
(one whose answers partly loop to max_tokens, one that fails a share of requests), its
history sampled every 0.2 s instead of 10 s, so a run of seconds has dozens of samples."""

from __future__ import annotations

from pathlib import Path

from tests.engine.runs import start_engine, write_prompts, write_spec
from tests.servers.ports import kill_pid
from tests.simserver import start_sim

PROMPTS = 600
SIM = ("--time-scale", "0.3", "--load-seconds", "0", "--answer-median", "120")


def recorded_run(root: Path) -> Path:
    """root/run, finished: every line done or failed, history.jsonl as the engine wrote it."""
    root.mkdir(parents=True, exist_ok=True)
    looping = start_sim(root, *SIM, "--loop-share", "0.15", "--accept-length",
                        "3.2", name="sim-a")
    failing = start_sim(root, *SIM, "--error-rate", "0.04", "--accept-length",
                        "2.4", name="sim-b")
    try:
        prompts = root / "prompts.jsonl"
        write_prompts(prompts, PROMPTS)
        spec = write_spec(root / "run.toml", prompts, [looping.url, failing.url],
                          batch_size=100, retries=1, max_tokens=400)
        engine = start_engine(spec, env={"FLEETDECK_HISTORY_INTERVAL_S": "0.2"})
        assert engine.wait(300) == 0, engine.stderr()
    finally:
        kill_pid(looping.proc)
        kill_pid(failing.proc)
    return engine.run_dir
