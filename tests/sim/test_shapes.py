"""Shapes of real SGLang the simulator plays on demand, read back by the agent's own readers:
one set of batch lines per DP rank (`--dp-size N --enable-dp-attention`), and the routes,
server-info body and log forms of an older release (`--sglang-version X`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agents.sim.versions import release
from agents.supervise.sglang_log import LogReader, parse_batch_line
from agents.supervise.sglang_metrics import read_metrics, read_server_info
from tests.plugins.supervised import agent, wait_status
from tests.servers.ports import wait_until
from tests.simserver import FAST_ARGS, SimHandle, start_sim

# A long answer whatever the prompt: ignore_eos runs it to max_new_tokens.
LONG = {"sampling_params": {"max_new_tokens": 6000, "ignore_eos": True}}


def busy(sim: SimHandle, n: int) -> threading.Thread:
    """n long answers in flight, on a thread (the test goes on reading the server)."""
    def run() -> None:
        with httpx.Client(timeout=120) as client:
            threads = [threading.Thread(target=client.post, args=(f"{sim.url}/generate",),
                                        kwargs={"json": {"text": f"Long story {i}.", **LONG}})
                       for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def dp4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    handle = start_sim(tmp_path_factory.mktemp("dp4"), "--time-scale", "0.05",
                       "--load-seconds", "0", "--decode-log-interval-s", "10",
                       "--enable-metrics", "--speculative-algorithm", "EAGLE",
                       "--dp-size", "4", "--tp-size", "8", "--enable-dp-attention")
    try:
        yield handle
    finally:
        handle.kill()


def test_dp_attention_ranks_log_their_own_lines(dp4: SimHandle) -> None:
    busy(dp4, 12)
    ranks: dict[int, list[str]] = {}

    def all_ranks_decoded_twice() -> bool:
        ranks.clear()
        for line in dp4.log_lines():
            rec = parse_batch_line(line)
            if rec is not None and rec.kind == "decode" and rec.dp is not None:
                ranks.setdefault(rec.dp, []).append(line)
        return len(ranks) == 4 and all(len(v) >= 2 for v in ranks.values())

    wait_until(all_ranks_decoded_twice, 30, "decode lines of 4 DP ranks")
    # DP attention: the ranks split one TP group of 8, so DP d logs as TP 2d.
    for d, lines in ranks.items():
        assert all(f" DP{d} TP{2 * d}] Decode batch, " in line for line in lines)
    # Ranks take turns (each starts its interval a quarter after the one before): once every
    # rank has requests (all four have logged; a rank with none logs nothing, and on a loaded
    # machine the 12 requests can arrive over more than one interval), the next four decode
    # lines come from four ranks.
    def after_all_ranks() -> list[int | None]:
        order = [rec.dp for line in dp4.log_lines()
                 if (rec := parse_batch_line(line)) is not None and rec.kind == "decode"]
        seen: set[int | None] = set()
        for i, d in enumerate(order):
            seen.add(d)
            if len(seen) == 4:
                return order[i + 1:]
        return []

    wait_until(lambda: len(after_all_ranks()) >= 4, 30, "4 decode lines once all ranks run")
    turns = after_all_ranks()[:4]
    assert len(set(turns)) == 4, turns
    reader = LogReader()
    reader.feed_text(dp4.log_text())
    combined = reader.combined()
    assert combined is not None and combined.ranks_seen == 4
    assert combined.accept_length_log is not None and 1 <= combined.accept_length_log <= 4
    info = read_server_info(httpx.get(f"{dp4.url}/server_info").json())
    assert info.num_internal_states == 4 and info.effective_max_running == 48
    assert info.effective_max_running_requests_per_dp == 12
    metrics = read_metrics(httpx.get(f"{dp4.url}/metrics").text)
    assert sorted(metrics.per_rank) == [f"dp_rank={d}" for d in range(4)]
    assert metrics.running_reqs == sum(r["running_reqs"] for r in metrics.per_rank.values())


@pytest.mark.parametrize(("version", "form", "head", "trailing", "accept", "rate"), [
    ("0.5.1", "list", "Decode batch. ", True, True, False),
    ("0.4.4.post3", "top_level", "Decode batch. ", True, True, False),
    ("0.4.1", "absent", "Decode batch. ", False, False, False),  # before accept len
    ("0.5.4", "list", "Decode batch [", True, True, True),
])
def test_an_older_version_has_its_routes_body_and_lines(tmp_path: Path, version: str,
                                                         form: str, head: str, trailing: bool,
                                                         accept: bool, rate: bool) -> None:
    sim = start_sim(tmp_path, *FAST_ARGS, "--speculative-algorithm", "EAGLE",
                    "--sglang-version", version)
    try:
        new_route = httpx.get(f"{sim.url}/server_info")  # only /get_server_info before 0.5.6
        assert new_route.status_code == 404 and new_route.json() == {"detail": "Not Found"}
        body = httpx.get(f"{sim.url}/get_server_info").json()
        info = read_server_info(body)
        assert info.version == version and info.internal_states_form == form
        assert info.effective_max_running_requests_per_dp is None  # 0.5.8+ only
        if release(version) >= (0, 4, 10, 0):
            graph_key = "cuda_graph" if release(version) < (0, 5, 2, 0) else "graph"
            assert graph_key in body["internal_states"][0]["memory_usage"]
        httpx.post(f"{sim.url}/generate", json={"text": "Tell me a story.", **LONG}, timeout=60)
        line = sim.wait_log(r"Decode batch").string
        assert head in line and line.endswith(", ") == trailing
        assert ("accept len:" in line) == accept and ("accept rate:" in line) == rate
        rec = parse_batch_line(line)
        assert rec is not None and rec.running_reqs and rec.gen_throughput is not None
        assert (rec.accept_length_log is not None) == accept
        assert "deprecated" not in sim.log_text()  # the old route is the only one yet
    finally:
        sim.kill()


# ----- through the real agent: the supervisor reads these shapes --------------------------

def test_supervisor_adds_up_the_ranks_of_a_dp_server(supervised) -> None:
    run = supervised(1, prompts=400, max_tokens=4000, concurrency_per_server=12,
                     sim_args="--dp-size 2 --tp-size 2 --enable-dp-attention --time-scale 0.2 "
                              "--decode-log-interval-s 5")
    assert agent("up", str(run.spec)).returncode == 0
    log = run.run_dir / "logs" / "sglang_gpu0.log"
    wait_until(lambda: log.exists() and " DP0 TP0] Decode batch" in log.read_text()
               and " DP1 TP1] Decode batch" in log.read_text(), 90, "both ranks decoding")

    def two_rank_values() -> set[float | None]:
        """The accept length of both ranks together at each point of the log so far."""
        reader, values = LogReader(), set()
        for line in log.read_text().split("\n"):
            reader.feed_line(line)
            combined = reader.combined()
            if combined is not None and combined.ranks_seen == 2:
                values.add(combined.accept_length_log)
        return values

    snap = wait_status(run.run_dir, lambda s: s["servers"][0]["state"] == "healthy"
                       and s["servers"][0]["accept_length_log"] in two_rank_values()
                       and (s["servers"][0]["running_reqs"] or 0) > 6, 60,
                       "accept length combined over both ranks' newest lines")
    server = snap["servers"][0]
    assert server["effective_max_running"] == 48  # 24 per rank, two ranks


def test_supervisor_reads_an_older_sglang_from_get_server_info(supervised) -> None:
    run = supervised(1, prompts=400, max_tokens=2000, concurrency_per_server=4,
                     sim_args="--sglang-version 0.5.1 --time-scale 0.2")
    assert agent("up", str(run.spec)).returncode == 0
    snap = wait_status(run.run_dir, lambda s: s["servers"] and s["servers"][0]["state"] ==
                       "healthy" and s["servers"][0]["accept_length_cum"] is not None
                       and s["servers"][0]["accept_length_log"] is not None, 90,
                       "cumulative accept length from /get_server_info")
    server = snap["servers"][0]
    assert server["last_error"] is None  # a 404 on /server_info is no error on 0.5.1
    assert server["effective_max_running"] == 48  # the launch argument: no per-rank cap yet
    assert 1 <= server["accept_length_cum"] <= 4
