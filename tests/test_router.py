"""Servers behind SGLang's router (issue 15, item 5): the real `sglang-router` (a pinned dev
dependency) in front of two simulators. The engine sends to the router as one server; the
supervisor lists the router's workers and watches each; a worker killed mid-run loses
nothing; a URL that is not a router, and per-server or auto resize, exit 2 at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.engine.router import parse_workers
from agents.rpc.protocol import INVALID_PARAMS, RpcError
from agents.supervise.launch import call
from tests.engine.runs import read_run, write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run, wait_status
from tests.servers.router import Router, point_at_router, start_router
from tests.simserver import SimHandle

# Slow enough that a worker is killed with requests in flight, fast enough for the suite.
SIM_ARGS = ("--enable-metrics", "--time-scale", "0.15")
PROMPTS = 240


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Callable[[list[str]], Router]]:
    started: list[Router] = []

    def start(worker_urls: list[str]) -> Router:
        started.append(start_router(tmp_path, worker_urls))
        return started[-1]

    yield start
    for r in started:
        r.kill()


def router_spec(root: Path, url: str, n: int = PROMPTS, **generate: Any) -> Path:
    """A run spec with `[servers] urls = [url]` and `router = true`."""
    spec = write_spec(root / "run.toml", root / "prompts.jsonl", [url], **generate)
    write_prompts(root / "prompts.jsonl", n)
    return point_at_router(spec, "health_interval_s = 0.3")


def worker_rows(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["url"]: s for s in snap["servers"] if s["number"] > 0}


def test_router_run_survives_a_killed_worker(
        tmp_path: Path, sims: Callable[..., SimHandle],
        router: Callable[[list[str]], Router]) -> None:
    a, b = sims(*SIM_ARGS), sims(*SIM_ARGS)
    r = router([a.url, b.url])
    spec = router_spec(tmp_path, r.url, max_tokens=256, concurrency_per_server=16)
    run_dir = tmp_path / "run"
    try:
        up = agent("up", str(spec))
        assert up.returncode == 0, up.stderr

        # Row 0 is the router (the engine's one server); each worker its own row, with
        # SGLang's figures read from that worker.
        snap = wait_status(
            run_dir, lambda s: len(worker_rows(s)) == 2 and all(
                w["state"] == "healthy" and w["gen_throughput"] is not None
                and w["accept_length_cum"] is not None for w in worker_rows(s).values())
            and (s["progress"] or {}).get("completed", 0) >= PROMPTS // 8,
            120, "both workers healthy with figures, an eighth done")
        assert snap["status"] == "running"
        assert snap["servers"][0]["number"] == 0
        assert snap["servers"][0]["url"] == r.url
        assert snap["servers"][0]["limit"] == 16
        assert set(worker_rows(snap)) == {a.url, b.url}
        assert all(w["running_reqs"] is not None for w in worker_rows(snap).values())
        assert snap["progress"]["gpus"] == 2, "the GPUs held are the workers', not the router's"

        b.kill()  # SIGKILL, with requests in flight on it
        snap = wait_status(run_dir, lambda s: worker_rows(s)[b.url]["state"] == "down",
                           120, "the killed worker shown down")
        assert worker_rows(snap)[a.url]["state"] == "healthy"
        assert any(al["code"] == f"server_down:{worker_rows(snap)[b.url]['number']}"
                   for al in snap["alerts"]), snap["alerts"]

        snap = wait_status(run_dir, lambda s: s["status"] in ("done", "failed"), 120,
                           "the run finished")
        assert snap["status"] == "done", snap.get("message")
        assert worker_rows(snap)[b.url]["state"] == "down"
        # The kill reached the router: it failed sends to the dead worker (and sent them on).
        assert f"worker_url={b.url}" in r.log.read_text(errors="replace")

        # Per-server and auto resize have nothing to apply to: refused at once, exit 2.
        for args in (("4", "--server", "1"), ("4", "--server", "0"), ("auto",)):
            refused = agent("resize", str(run_dir), *args)
            assert refused.returncode == 2, (args, refused.stderr)
            assert "router" in refused.stderr, refused.stderr
        with pytest.raises(RpcError) as exc:
            asyncio.run(call(run_dir, "resize", {"value": 4, "server": 1}))
        assert exc.value.code == INVALID_PARAMS and "--server" in exc.value.message
        ok = agent("resize", str(run_dir), "12")  # the router's concurrency as a whole
        assert ok.returncode == 0, ok.stderr
    finally:
        if (run_dir / "supervisor.pid").exists():
            agent("down", str(run_dir), "--yes")
        kill_run(run_dir)

    # Nothing lost: every index done or failed, once (read_run asserts no line or record
    # twice); the router sent the killed worker's requests again to the live one.
    st = read_run(run_dir)
    assert set(st.current) | st.failed == set(range(PROMPTS))
    assert not set(st.current) & st.failed
    assert not st.failed, f"failed: {sorted(st.failed)[:10]}"
    verify = agent("verify", str(run_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads((run_dir / "control.json").read_text())["concurrency"]["default"] == 12


def test_router_true_at_a_plain_server_is_refused(
        tmp_path: Path, sims: Callable[..., SimHandle]) -> None:
    sim = sims()
    spec = router_spec(tmp_path, sim.url, n=10)
    run_dir = tmp_path / "run"
    for verb in ("up", "generate"):
        res = agent(verb, str(spec))
        assert res.returncode == 2, (verb, res.stdout, res.stderr)
        assert "not SGLang's router" in res.stderr and f"{sim.url}/workers" in res.stderr, \
            res.stderr
        assert "404" in res.stderr, res.stderr
        assert not run_dir.exists(), f"{verb} started something"


def test_router_spec_mistakes_exit_2(tmp_path: Path) -> None:
    """Caught when the spec loads, before any URL is asked."""
    cases = [({"concurrency_per_server": "auto"}, None, "concurrency_per_server"),
             ({}, ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"], "takes one URL")]
    for generate, urls, said in cases:
        spec = router_spec(tmp_path, "http://127.0.0.1:9", n=5, **generate)
        if urls is not None:
            spec.write_text(spec.read_text().replace('["http://127.0.0.1:9"]', json.dumps(urls)))
        res = agent("up", str(spec))
        assert res.returncode == 2, res.stderr
        assert said in res.stderr and "router" in res.stderr, res.stderr
        assert not (tmp_path / "run").exists()


def test_refused_resize_leaves_control_alone(tmp_path: Path) -> None:
    """The refusal comes before control.json is touched: no rev, no audit line."""
    spec = router_spec(tmp_path, "http://127.0.0.1:9", n=5)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(spec.read_text())
    (run_dir / "control.json").write_text(json.dumps(
        {"rev": 3, "concurrency": {"default": 8}, "max_tokens": 256}))
    res = agent("resize", str(run_dir), "auto")
    assert res.returncode == 2, res.stderr
    # The console's verb says the same: exit 2 with the agent's reason.
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f'[[nodes]]\nname = "gen-1"\nlocal = true\nrun_dir = "{run_dir}"\n'
                     f'agent = "{sys.executable} -m agents.cli"\n')
    res = subprocess.run([sys.executable, "-m", "console.cli", "--fleet", str(fleet), "resize",
                          "gen-1", "4", "--server", "1"], capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "router" in res.stderr
    assert json.loads((run_dir / "control.json").read_text())["rev"] == 3
    assert not (run_dir / "control.log.jsonl").exists()


@pytest.mark.parametrize("body", [
    {"version": "0.5.6", "internal_states": []},  # a plain server's /server_info
    [{"url": "http://a:1"}],
    {"workers": [{"id": "w1"}]},
    {"workers": "http://a:1"},
])
def test_an_answer_not_the_routers_is_refused(body: Any) -> None:
    with pytest.raises(ValueError, match="not the router's answer"):
        parse_workers(body)
