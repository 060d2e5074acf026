"""The simulator against what a real SGLang 0.5.23 answered, exposed and logged
(tests/fixtures/sglang/real-0.5.23/, recorded by scripts/record_sglang_goldens.py): the same
request gets an answer of the same keys, types and nesting; /metrics has the families the
product reads with the same type, labels and help; /server_info the keys it reads; the log
lines read the same through the agent's reader. Each simulator here is started with the
flags of the real server it plays (no reasoning parser, no speculative decoding: what a CPU
server serving a tiny model has); the spec-decoding shapes a CPU cannot show stay in
test_fidelity.py's hand-written goldens."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agents.supervise.sglang_log import LogReader, parse_batch_line, read_log
from tests.servers.ports import wait_until
from tests.sim.realgoldens import (
    REAL,
    differences,
    families,
    load,
    manifest,
    read_by_product,
    shape,
    sse_events,
    template,
)
from tests.simserver import SimHandle, start_sim

# The real servers' flags, as the simulator takes them (tests/real/server.py CPU_FLAGS and
# the recorder's profiles); the tiny model's context is 4,096 tokens. Short natural answers
# (median 8 tokens) so that an answer can stop as well as run to its limit.
PLAY_REAL = ("--enable-metrics", "--reasoning-parser", "none", "--accept-length", "0",
             "--context-length", "4096", "--load-seconds", "0", "--answer-median", "8",
             "--decode-log-interval-s", "1")
# Filled by content: null without cached tokens, a dict with them.
NULLABLE = frozenset({"cached_tokens_details"})
# SGLang adds these only when there is something to say (decode_throughput needs 2 tokens).
BY_CONTENT = frozenset({"decode_throughput", "first_token_latency"})
SSE = "text/event-stream"
GRAPH = re.compile(r"\b\w+ graph: (?:True|False)")


def same_shape(real: Any, sim: Any, what: str, optional: frozenset[str] = frozenset()) -> None:
    diffs = differences(shape(real), shape(sim), NULLABLE)
    diffs = [d for d in diffs if not any(f".{k}:" in d for k in optional)]
    assert not diffs, f"{what}:\n  " + "\n  ".join(diffs)


def media(content_type: str | None) -> str | None:
    return content_type.split(";")[0].strip() if content_type else None


def replay(sim: SimHandle, ex: dict[str, Any]) -> httpx.Response:
    req = ex["request"]
    return httpx.request(req["method"], f"{sim.url}{req['path']}", json=req["body"], timeout=60)


def same_exchange(sim: SimHandle, rel: str, optional: frozenset[str] = BY_CONTENT
                  ) -> tuple[dict[str, Any], httpx.Response]:
    ex = load(rel)
    resp = replay(sim, ex)
    assert resp.status_code == ex["status"], (rel, resp.text[:300])
    assert media(resp.headers.get("content-type")) == media(ex["content_type"]), rel
    if "body" in ex:
        same_shape(ex["body"], resp.json(), rel, optional)
    else:
        assert resp.text == ex["text"] or media(ex["content_type"]) == SSE, rel
    return ex, resp


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """The real default server, played: KV pool 65,536, speed a fifth of wall time."""
    handle = start_sim(tmp_path_factory.mktemp("real-default"), *PLAY_REAL, "--time-scale",
                       "0.2", "--max-total-tokens", "65536")
    try:
        yield handle
    finally:
        handle.kill()


def test_the_goldens_are_real_recordings_with_their_manifest() -> None:
    m = manifest()
    assert m["sglang_version"] == "0.5.23" and m["recorder"] == "scripts/record_sglang_goldens.py"
    on_disk = {p.relative_to(REAL).as_posix() for p in REAL.rglob("*") if p.is_file()}
    assert on_disk - {"manifest.json"} == set(m["files"]), "manifest and folder differ"
    for name, server in m["servers"].items():
        assert server["version"] == "0.5.23" and server["started_by_recorder"], name
        assert "--max-total-tokens" in server["launch_command"], name
    # no *.expected.json here: tests/agent/test_sglang_corpus.py counts those per folder
    assert not list(REAL.rglob("*.expected.json"))


# ----- answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["bodies/chat_stop.json", "bodies/chat_length.json",
                                 "bodies/generate_stop.json", "bodies/generate_length.json",
                                 "bodies/completion_length.json"])
def test_an_answer_has_the_real_shape(played: SimHandle, rel: str) -> None:
    ex, resp = same_exchange(played, rel)
    real, sim = ex["body"], resp.json()
    if "choices" in real:  # the finish fields carry the same kind of value
        want, got = real["choices"][0], sim["choices"][0]
        assert got["finish_reason"] == want["finish_reason"], rel
        assert type(got["matched_stop"]) is type(want["matched_stop"]), rel
        assert sim["model"] == real["model"] == ex["request"]["body"]["model"]  # echoed
    else:
        want, got = real["meta_info"]["finish_reason"], sim["meta_info"]["finish_reason"]
        assert got["type"] == want["type"] and set(got) == set(want), rel


def test_generate_without_max_new_tokens_runs_to_the_real_default(played: SimHandle) -> None:
    ex, resp = same_exchange(played, "bodies/generate_default_length.json")
    real = ex["body"]["meta_info"]["finish_reason"]
    assert real["type"] == "length"
    assert resp.json()["meta_info"]["finish_reason"] == real  # 128 both


@pytest.mark.parametrize("rel", ["bodies/chat_stream.json", "bodies/generate_stream.json"])
def test_a_stream_has_the_real_events(played: SimHandle, rel: str) -> None:
    ex, resp = same_exchange(played, rel)
    real, sim = sse_events(ex["text"]), sse_events(resp.text)
    assert resp.headers["content-type"].startswith("text/event-stream")
    for name, r, s in (("first", real[0], sim[0]), ("last", real[-1], sim[-1]),
                       ("next to last", real[-2], sim[-2])):
        same_shape(r, s, f"{rel}: the {name} event", BY_CONTENT)


@pytest.mark.parametrize("rel", [f"bodies/{name}.json" for name in (
    "get_v1_models", "get_model_info", "get_v1_loads", "get_v1_loads_include_core", "health")])
def test_a_get_has_the_real_shape(played: SimHandle, rel: str) -> None:
    # /model_info's `embedding` (forty keys on embedding support) is left out of the sim
    same_exchange(played, rel, BY_CONTENT | {"embedding"})


@pytest.mark.parametrize("rel", ["errors/chat_context_too_long.json",
                                 "errors/generate_context_too_long.json",
                                 "errors/chat_no_messages.json", "errors/unknown_route.json"])
def test_an_error_has_the_real_status_and_body(played: SimHandle, rel: str) -> None:
    ex, resp = same_exchange(played, rel)
    if "too_long" in rel:  # SGLang's own words, the numbers of this request
        real = json.dumps(ex["body"])
        assert re.sub(r"\d+", "N", json.dumps(resp.json())) == re.sub(r"\d+", "N", real)


@pytest.mark.parametrize("name", ["chat", "generate"])
def test_an_abort_by_rid_answers_as_the_real_one(played: SimHandle, name: str) -> None:
    aborted = load(f"bodies/{name}_aborted.json")
    out: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: out.update(r=replay(played, aborted)))
    t.start()
    wait_until(lambda: httpx.get(f"{played.url}/sim/state").json()["running"] >= 1, 10,
               "the request running")
    same_exchange(played, f"bodies/abort_{name}.json")
    t.join(30)
    resp = out["r"]
    assert resp.status_code == aborted["status"] == 200
    same_shape(aborted["body"], resp.json(), f"{name}_aborted", BY_CONTENT)
    real, sim = aborted["body"], resp.json()
    if name == "chat":
        assert sim["choices"][0]["finish_reason"] == real["choices"][0]["finish_reason"]
    else:
        assert sim["meta_info"]["finish_reason"] == real["meta_info"]["finish_reason"]
    same_exchange(played, "bodies/abort_unknown_rid.json")


# ----- what the server says about itself --------------------------------------------------

def test_server_info_has_the_keys_the_product_reads(played: SimHandle) -> None:
    real = load("server_info/server_info.json")
    sim = httpx.get(f"{played.url}/server_info").json()
    top = read_by_product(set(real)) - {"internal_states"}
    state = read_by_product(set(real["internal_states"][0])) - top
    assert {"version", "max_total_num_tokens", "max_running_requests"} <= top
    assert {"last_gen_throughput", "effective_max_running_requests_per_dp"} <= state
    same_shape({k: real[k] for k in top}, {k: sim.get(k) for k in top}, "/server_info")
    same_shape({k: real["internal_states"][0][k] for k in state},
               {k: sim["internal_states"][0].get(k) for k in state}, "internal_states[0]")
    assert sim["version"] == real["version"]
    assert sim["max_running_requests"] is real["max_running_requests"] is None  # not set
    old = httpx.get(f"{played.url}/get_server_info")
    assert old.status_code == load("server_info/get_server_info.json")["status"]


def metrics_families(sim: SimHandle) -> dict[str, tuple[str, frozenset[str], str]]:
    return families(httpx.get(f"{sim.url}/metrics").text)


def same_families(real_rels: list[str], sim_families: dict[str, tuple[str, frozenset[str],
                                                                          str]]) -> set[str]:
    real: dict[str, tuple[str, frozenset[str], str]] = {}
    for rel in real_rels:
        real.update(families(load(rel)))
    read = read_by_product(set(real), "sglang:")
    for name in sorted(read):
        assert name in sim_families, f"{name}: in the real /metrics, not in the simulator's"
        kind, labels, doc = real[name]
        got = sim_families[name]
        assert got[0] == kind, (name, got[0], kind)
        assert got[1] == labels, (name, sorted(got[1]), sorted(labels))
        assert got[2] == doc, (name, got[2], doc)
    return read


def test_metrics_have_the_families_the_product_reads(played: SimHandle) -> None:
    httpx.post(f"{played.url}/generate", json={"text": "x", "sampling_params": {
        "max_new_tokens": 8}}, timeout=30)
    read = same_families(["metrics/idle.txt", "metrics/busy.txt"], metrics_families(played))
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
            "sglang:token_usage", "sglang:prompt_tokens_total"} <= read


# ----- the log ----------------------------------------------------------------------------

def fields(line: str) -> tuple[str, frozenset[str]]:
    rec = parse_batch_line(line)
    assert rec is not None, line
    names = {k for k in ("running_reqs", "queued_reqs", "num_tokens", "token_usage",
                         "gen_throughput", "accept_length_log", "accept_rate", "graph",
                         "new_seqs", "new_tokens", "cached_tokens", "pending_tokens",
                         "input_throughput") if getattr(rec, k) is not None}
    return rec.kind, frozenset(names | set(rec.extras))


def templates(lines: list[str]) -> set[str]:
    """The form of each line: numbers as N, the device's `<word> graph: <bool>` as one."""
    return {GRAPH.sub("GRAPH", template(line)) for line in lines}


def test_batch_lines_read_as_the_real_ones(played: SimHandle) -> None:
    for i in range(4):
        httpx.post(f"{played.url}/generate", json={"text": f"Line {i}", "sampling_params": {
            "max_new_tokens": 400, "ignore_eos": True}}, timeout=60)
    played.wait_log(r"Decode batch")
    sim = [ln for ln in played.log_lines() if "batch," in ln]
    for kind in ("decode", "prefill"):
        real = load(f"{kind}/default.log").splitlines()
        ours = [ln for ln in sim if ln.split("] ", 1)[-1].lower().startswith(kind)]
        assert ours, f"the simulator logged no {kind} line"
        assert {fields(ln) for ln in ours} == {fields(ln) for ln in real}, kind
        assert templates(ours) == templates(real), kind


def startup_facts(text: str) -> tuple[set[str], bool, bool]:
    reader = LogReader()
    reader.feed_text(text)
    st = reader.startup
    keys = {re.sub(r"available_\w+_mem\w*", "available_mem", k) for k in st.capacity}
    return keys, st.uvicorn_url is not None, st.ready


def test_start_up_lines_read_as_the_real_ones(played: SimHandle) -> None:
    real = startup_facts(load("startup/default.log"))
    assert real[1] and real[2] and "max_total_num_tokens" in real[0]
    assert startup_facts(played.log_text()) == real


# ----- a small KV pool: queueing and retraction -------------------------------------------

@pytest.fixture(scope="module")
def small_kv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """The real small-KV server, played: 3,072 tokens of KV, at a third of real time so that
    the queue lasts (~0.7 s) longer than a look at it takes on a loaded machine."""
    handle = start_sim(tmp_path_factory.mktemp("real-small-kv"), *PLAY_REAL, "--time-scale",
                       "3", "--max-total-tokens", "3072", "--answer-median", "5000",
                       "--decode-log-interval-s", "0.05")
    try:
        yield handle
    finally:
        handle.kill()


def burst(sim: SimHandle) -> tuple[list[dict[str, Any]], list[int]]:
    """The recorder's burst: 16 /generate at once, a quarter of 32 tokens, the rest 256;
    /health read while it runs. They arrive while the server is paused, so that they reach
    one scheduler round together, as they reach a real server on a CPU (a step there
    outlasts the spread of 16 client threads starting)."""
    results: list[dict[str, Any]] = []
    health: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(httpx.post(
        f"{sim.url}/generate", timeout=60, json={
            "text": f"Story {i}: once upon a time", "sampling_params": {
                "max_new_tokens": 32 if i % 4 == 0 else 256}}).json())) for i in range(16)]
    httpx.post(f"{sim.url}/pause_generation", json={"mode": "in_place"})
    for t in threads:
        t.start()
    wait_until(lambda: httpx.get(f"{sim.url}/sim/state").json()["queued"] == 16, 20,
               "16 requests waiting")
    httpx.post(f"{sim.url}/continue_generation")
    while any(t.is_alive() for t in threads):
        health.append(httpx.get(f"{sim.url}/health", timeout=30).status_code)
    for t in threads:
        t.join()
    return results, health


def test_a_small_kv_pool_queues_and_retracts_as_the_real_one(small_kv: SimHandle) -> None:
    before = httpx.get(f"{small_kv.url}/sim/state").json()["kv"]
    results, health = burst(small_kv)
    kv = httpx.get(f"{small_kv.url}/sim/state").json()["kv"]
    # the first round takes what fits in full, the rest wait: an admission refused for KV
    # (a count, not a look at the queue, which lasts ~0.7 s and a loaded machine can miss)
    assert kv["refusals"] > before["refusals"]
    assert len(results) == 16 and all(r["meta_info"]["finish_reason"]["type"] == "length"
                                      for r in results)
    assert set(health) == set(load("bodies/small-kv_health_while_queued.json")["codes"])
    retracted = [r for r in results if r["meta_info"]["num_retractions"] > 0]
    assert retracted, "no answer was retracted"
    real = load("bodies/generate_retracted.json")
    same_shape(real["body"], retracted[0], "a retracted answer", BY_CONTENT)
    # The retraction line: the real one's words, every number where the real one has one.
    line = small_kv.wait_log(r"KV cache pool is full").string
    assert templates([line]) == templates(load("decode/small-kv_retract.log").splitlines())
    # Its counters: the families the product reads, as the real server shows them after.
    sim = metrics_families(small_kv)
    same_families(["metrics/small-kv_queued.txt", "metrics/small-kv_after.txt"], sim)
    real_after = families(load("metrics/small-kv_after.txt"))
    for name in ("sglang:num_retracted_reqs", "sglang:num_retracted_requests_total"):
        assert sim[name][:2] == real_after[name][:2], name
    text = httpx.get(f"{small_kv.url}/metrics").text
    total = re.search(r"^sglang:num_retracted_requests_total\{.*\} (\S+)$", text, re.M)
    assert total is not None and float(total.group(1)) == kv["retracted_reqs_total"] >= 1
    assert kv["used"] == 0 and kv["new_token_ratio"] == 0.7  # idle: the ratio starts over


def test_real_log_files_read_through_the_agent() -> None:
    """The recorded lines themselves through the agent's reader: every batch line parses,
    the small-KV decode lines show the queue the server had."""
    for rel in ("decode/default.log", "prefill/default.log", "decode/small-kv.log"):
        path = REAL / rel
        reader = read_log(path)
        assert len(reader.records) == len(path.read_text().splitlines()), rel
    queued = [r.queued_reqs for r in read_log(REAL / "decode/small-kv.log").records]
    assert max(q or 0 for q in queued) > 0


# ----- a full queue: the only 503 a real server gives for load ------------------------------

def test_a_full_queue_refuses_as_the_real_one(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The recorder's overload profile: --max-running-requests 2 --max-queued-requests 2 and
    8 requests at once, chat and /generate in turn. Without --max-queued-requests a real
    server queues without limit and answers 200 (the small-KV burst: no 503)."""
    real = {p: load(f"errors/{name}_queue_full.json")
            for p, name in (("/v1/chat/completions", "chat"), ("/generate", "generate"))}
    sim = start_sim(tmp_path_factory.mktemp("real-overload"), *PLAY_REAL, "--time-scale",
                    "1", "--max-running-requests", "2", "--max-queued-requests", "2",
                    "--answer-median", "5000")
    try:
        out: list[tuple[str, httpx.Response]] = []
        ex = list(real.values())
        threads = [threading.Thread(target=lambda i=i: out.append(
            (ex[i % 2]["request"]["path"], replay(sim, ex[i % 2])))) for i in range(8)]
        # paused: all arrive before any runs (the real server's 8 came within one step)
        httpx.post(f"{sim.url}/pause_generation", json={"mode": "in_place"})
        for t in threads:
            t.start()
        wait_until(lambda: len(out) == 6, 30, "six refusals")
        httpx.post(f"{sim.url}/continue_generation")
        for t in threads:
            t.join(60)
        statuses = sorted(r.status_code for _, r in out)
        assert set(statuses) == set(load("bodies/overload_statuses.json")["statuses"])
        assert statuses.count(200) == 2  # two wait; the third arrival is refused
        for path, resp in out:
            if resp.status_code == 503:
                assert resp.json() == real[path]["body"], path  # word for word
    finally:
        sim.kill()
