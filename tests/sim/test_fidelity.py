"""The simulator's behaviour beyond what a real server on this CPU can show: speculative
decoding, a reasoning parser's split, tool calls, keys, hybrid and multi-rank log forms, and
the simulator's own controls. The shapes a CPU server does show are checked against real
recordings in test_real_fidelity.py; what is left here is hand-written in
tests/sim/golden/beyond_cpu.json from shared/reference/sglang.md (never from the simulator),
or read from the public captures of tests/fixtures/sglang/.

Golden shape language: a type name ("str", "int", "number", "bool", "null", "dict", "list",
"any", or a union "str|null"); an object {"keys": required, "optional": ..., "absent": [...],
"nullable": true}, unnamed extra keys allowed; or a list [element shape].
"""

from __future__ import annotations

import itertools
import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers.ports import wait_until
from tests.simserver import FAST_ARGS, SimHandle, start_sim

GOLDEN = Path(__file__).parent / "golden"
CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
TYPES: dict[str, Any] = {"str": str, "int": int, "number": (int, float), "bool": bool,
                         "null": type(None), "dict": dict, "list": list}
PREFIX = r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?: DP\d+)?(?: TP\d+)?\] "
# Written from sglang.md §4: standard and hybrid token fields, the [old] form ('.' after
# "Decode batch", no accept rate, trailing ", ").
DECODE_RE = re.compile(
    PREFIX + r"Decode batch[.,] #running-req: (?P<running>\d+), "
    r"(?:#token: (?P<token>\d+), token usage: (?P<usage>\d+\.\d+)"
    r"|#full token: (?P<full>\d+), full token usage: (?P<full_usage>\d+\.\d+), "
    r"mamba num: (?P<mamba>\d+), mamba usage: (?P<mamba_usage>\d+\.\d+)), "
    r"(?:accept len: (?P<accept>\d+\.\d+), (?:accept rate: (?P<rate>\d+\.\d+), )?)?"
    r"\w+ graph: (?:True|False), gen throughput \(token/s\): (?P<tput>\d+\.\d+), "
    r"#queue-req: (?P<queue>\d+)(?:, )?$")
READY_RE = re.compile(PREFIX + r"The server is fired up and ready to roll!$")


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / "beyond_cpu.json").read_text())[name]
    return data


def corpus_lines(rel: str) -> list[str]:
    return (CORPUS / rel).read_text().splitlines()


def check(value: Any, shape: Any, path: str = "$") -> None:
    """Assert that value has the golden shape (see the module docstring)."""
    if isinstance(shape, str):
        if shape == "any":
            return
        kinds = tuple(TYPES[k] for k in shape.split("|"))
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        assert ok, f"{path}: expected {shape}, got {type(value).__name__} {value!r:.80}"
    elif isinstance(shape, list):
        assert isinstance(value, list) and value, f"{path}: expected a non-empty list"
        for i, item in enumerate(value):
            check(item, shape[0], f"{path}[{i}]")
    else:
        if value is None and shape.get("nullable"):
            return
        assert isinstance(value, dict), f"{path}: expected an object, got {value!r:.80}"
        for key, sub in shape.get("keys", {}).items():
            assert key in value, f"{path}: key {key!r} missing (has {sorted(value)})"
            check(value[key], sub, f"{path}.{key}")
        for key, sub in shape.get("optional", {}).items():
            if key in value:
                check(value[key], sub, f"{path}.{key}")
        for key in shape.get("absent", []):
            assert key not in value, f"{path}: key {key!r} must be absent"


def sse_events(body: str) -> list[str]:
    """The `data:` payloads of an SGLang SSE body, asserting the framing."""
    assert body.endswith("\n\n"), "an SSE body ends with a blank line"
    events = body[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: "), f"not an SSE data line: {event!r:.80}"
    return [e[len("data: "):] for e in events]


def chat(sim: SimHandle, **body: Any) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "Tell me about the sea."}])
    return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10)


def test_golden_shapes_catch_mismatches() -> None:
    # the checker itself must fail on wrong shapes, or every test below could not fail
    shape = golden("reasoning_usage")["keys"]["usage"]
    with pytest.raises(AssertionError):
        check({"reasoning_tokens": 1}, shape)
    with pytest.raises(AssertionError):
        check({"a": True}, {"keys": {"a": "int"}})
    with pytest.raises(AssertionError):
        check({"sglext": {}}, {"absent": ["sglext"]})


def test_chat_with_a_reasoning_parser_splits_the_thinking(sim: SimHandle) -> None:
    resp = chat(sim, max_tokens=200, model="whatever", an_unknown_field={"x": 1})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    obj = resp.json()
    check(obj, golden("reasoning_usage"))
    choice = obj["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert obj["model"] == "whatever"  # the request's own, as SGLang echoes it
    usage = obj["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["reasoning_tokens"] > 0  # thinking is on by default
    assert usage["completion_tokens_details"] == {"reasoning_tokens": usage["reasoning_tokens"]}
    assert usage["completion_tokens"] <= 200
    message = choice["message"]
    assert "<think>" not in (message["content"] or "")
    assert message["reasoning_content"], "qwen3 parser: reasoning split out of content"
    if choice["finish_reason"] == "stop":
        assert message["content"]


def test_chat_spec_details_and_meta_info(sim: SimHandle) -> None:
    obj = chat(sim, max_tokens=300, return_spec_tokens_details=True,
               return_meta_info=True).json()
    check(obj, golden("spec_tokens_details"))
    check(obj, golden("chat_meta_info"))
    details = obj["sglext"]["spec_tokens_details"]
    n = obj["usage"]["completion_tokens"]
    assert details["spec_verify_ct"] >= math.ceil(n / 4)  # at most num_steps + 1 a forward
    assert details["spec_accept_length"] == pytest.approx(n / details["spec_verify_ct"])
    meta = obj["choices"][0]["meta_info"]
    assert meta["completion_tokens"] == n
    assert meta["spec_verify_ct"] == details["spec_verify_ct"]


def test_truncated_inside_think_puts_everything_in_reasoning(sim: SimHandle) -> None:
    obj = chat(sim, max_tokens=3).json()
    choice = obj["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["matched_stop"] is None
    assert choice["message"]["content"] == ""
    assert choice["message"]["reasoning_content"]
    assert obj["usage"]["completion_tokens"] == 3


def test_output_length_is_max_completion_tokens_or_max_tokens(sim: SimHandle) -> None:
    obj = chat(sim, max_completion_tokens=5, max_tokens=900).json()
    assert obj["usage"]["completion_tokens"] <= 5
    state = httpx.get(f"{sim.url}/sim/state").json()
    assert state["last_max_tokens"][-1] == 5
    assert state["max_tokens_counts"]["5"] >= 1


def test_ignore_eos_and_completions_default_length(sim: SimHandle) -> None:
    meta = httpx.post(f"{sim.url}/generate", json={"text": "x", "sampling_params": {
        "max_new_tokens": 50, "ignore_eos": True}}).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 50}
    obj = chat(sim, max_tokens=40, ignore_eos=True).json()
    assert obj["usage"]["completion_tokens"] == 40
    assert obj["choices"][0]["finish_reason"] == "length"
    short = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "x", "ignore_eos": True})
    assert short.json()["usage"]["completion_tokens"] == 16  # CompletionRequest default


def test_thinking_off_and_separate_reasoning_off(sim: SimHandle) -> None:
    off = chat(sim, max_tokens=100, chat_template_kwargs={"enable_thinking": False}).json()
    msg = off["choices"][0]["message"]
    assert msg["reasoning_content"] is None
    assert off["usage"]["reasoning_tokens"] == 0
    assert off["usage"]["completion_tokens_details"] is None
    raw = chat(sim, max_tokens=100, separate_reasoning=False).json()["choices"][0]
    assert raw["message"]["reasoning_content"] is None
    assert raw["message"]["content"].startswith("<think>")


def test_tools_sometimes_answer_with_tool_calls(sim: SimHandle) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    finishes = []
    for i in range(16):  # an answer is its prompt's: ask 16 questions
        question = [{"role": "user", "content": f"Is it raining in town {i}?"}]
        obj = chat(sim, max_tokens=2000, tools=tools, messages=question).json()
        choice = obj["choices"][0]
        finishes.append(choice["finish_reason"])
        if choice["finish_reason"] == "tool_calls":
            calls = choice["message"]["tool_calls"]
            check(calls, [golden("tool_call")])
            assert calls[0]["function"]["name"] == "get_weather"
            assert set(json.loads(calls[0]["function"]["arguments"])) == {"city"}
            assert choice["message"]["content"] == ""
        else:
            assert "tool_calls" not in choice["message"]  # SGLang leaves it out
    assert "tool_calls" in finishes and len(set(finishes)) > 1  # sometimes, not always


def test_chat_stream_splits_the_thinking(sim: SimHandle) -> None:
    resp = chat(sim, max_tokens=60, stream=True, stream_options={"include_usage": True},
                return_spec_tokens_details=True)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage_chunk = chunks.pop()
    assert usage_chunk["choices"] == []
    reasoning = content = ""
    for c in chunks:
        delta = c["choices"][0]["delta"]
        assert set(delta) <= set(golden("stream_delta_keys")), delta
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert reasoning and "<think>" not in reasoning + content
    assert usage_chunk["usage"]["completion_tokens"] <= 60
    assert len({c["id"] for c in chunks}) == 1


def test_completions_and_stream(sim: SimHandle) -> None:
    obj = httpx.post(f"{sim.url}/v1/completions", json={"prompt": "Once upon", "max_tokens": 40,
                                                        "junk": True}).json()
    assert obj["choices"][0]["finish_reason"] in ("stop", "length")
    assert obj["choices"][0]["text"].startswith("<think>")  # no reasoning parser here
    body = httpx.post(f"{sim.url}/v1/completions",
                      json={"prompt": "Once upon", "max_tokens": 40, "stream": True}).text
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(c["choices"][0]["text"] for c in chunks).startswith("<think>")


def test_generate_with_speculative_decoding(sim: SimHandle) -> None:
    g = golden("generate_spec_meta")
    obj = httpx.post(f"{sim.url}/generate",
                     json={"text": "The capital of France", "rid": "my-rid-1",
                           "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    check(obj, g)
    meta = obj["meta_info"]
    assert meta["id"] == "my-rid-1"
    assert meta["completion_tokens"] == len(obj["output_ids"]) <= 8
    if meta["finish_reason"]["type"] == "length":
        assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"]
                                                       / meta["spec_verify_ct"])
    batch = httpx.post(f"{sim.url}/generate",
                       json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 4}}).json()
    assert isinstance(batch, list) and len(batch) == 2
    for item in batch:
        check(item, g)
    ids = httpx.post(f"{sim.url}/generate", json={"input_ids": [1, 2, 3],
                                                  "sampling_params": {"max_new_tokens": 4}})
    assert ids.json()["meta_info"]["prompt_tokens"] == 3


def test_generate_default_max_new_tokens(sim: SimHandle) -> None:
    limit = 128  # as the real server ran it (test_real_fidelity.py)
    before = httpx.get(f"{sim.url}/sim/state").json()["max_tokens_counts"].get("none", 0)
    for _ in range(3):
        meta = httpx.post(f"{sim.url}/generate", json={
            "text": "hi", "sampling_params": {"ignore_eos": True}}).json()["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": limit}
    assert httpx.get(f"{sim.url}/sim/state").json()["max_tokens_counts"]["none"] == before + 3


def test_generate_stream_text_is_cumulative(sim: SimHandle) -> None:
    body = httpx.post(f"{sim.url}/generate", json={
        "text": "Hello", "stream": True, "sampling_params": {"max_new_tokens": 40}}).text
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    for before, after in itertools.pairwise(chunks):
        assert after["text"].startswith(before["text"])
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] in ("stop", "length")


def test_server_info_under_speculative_decoding(sim: SimHandle) -> None:
    g = golden("server_info_spec")
    info = httpx.get(f"{sim.url}/server_info").json()
    assert info["speculative_algorithm"] == g["nextn_becomes"]
    assert info["max_running_requests"] == 48  # SGLang's own setting under EAGLE
    assert len(info["internal_states"]) == 1
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 48
    chat(sim, max_tokens=200)
    sim.wait_log(DECODE_RE.pattern)
    wait_until(lambda: g["accept_length_key"] in httpx.get(f"{sim.url}/server_info").json()[
        "internal_states"][0], 10, "the cumulative accept length folded in")
    old = httpx.get(f"{sim.url}/get_server_info")
    assert old.status_code == 200 and old.json()["version"] == info["version"]
    sim.wait_log(PREFIX + r".*/get_server_info.*deprecated")


def test_models_and_model_info_name_the_served_model(sim: SimHandle) -> None:
    models = httpx.get(f"{sim.url}/v1/models").json()
    assert models["data"][0]["id"] == "qwen3-mtp"
    for path in ("/model_info", "/get_model_info"):
        assert httpx.get(f"{sim.url}{path}").json()["served_model_name"] == "qwen3-mtp"


def test_loads_under_speculative_decoding(sim: SimHandle) -> None:
    g = golden("loads_spec")
    chat(sim, max_tokens=20)
    check(httpx.get(f"{sim.url}/v1/loads").json(), g)
    check(httpx.get(f"{sim.url}/v1/loads", params={"include": "all"}).json(), g)
    core = httpx.get(f"{sim.url}/v1/loads", params={"include": "core"}).json()
    assert "speculative" not in core["loads"][0] and "num_running_reqs" in core["loads"][0]
    spec = httpx.get(f"{sim.url}/v1/loads", params={"include": "spec"}).json()
    assert "accept_length" in spec["loads"][0]["speculative"]
    text = httpx.get(f"{sim.url}/v1/loads", params={"format": "prometheus"}).text
    names = {f.name for f in text_string_to_metric_families(text)}
    assert set(g["prometheus_names"]) <= names
    assert httpx.get(f"{sim.url}/v1/loads", params={"include": "nope"}).status_code == 400


def test_metrics_exposition(sim: SimHandle) -> None:
    """The spec counter (beyond the CPU), and the exposition's form on every line, the
    simulator's and the real server's (prometheus_client multiprocess: sorted labels, float
    values, no `_created`)."""
    g = golden("metrics_spec")
    chat(sim, max_tokens=50)
    httpx.post(f"{sim.url}/generate", json={"text": "x", "stream": True,
                                            "sampling_params": {"max_new_tokens": 5}})
    text = httpx.get(f"{sim.url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, want in g["families"].items():
        fam = families[name]
        assert fam.type == want["type"] and fam.samples, name
        for s in fam.samples:
            assert s.labels["model_name"] == "qwen3-mtp"
            assert set(s.labels) - {"le"} == set(want["labels"]), (name, s.labels)
    for name, text_help in g["help"].items():
        assert families[name].documentation == text_help
    streaming = {s.labels["is_streaming"] for s in families["sglang:num_requests"].samples}
    assert streaming == {"true", "false"}
    sample = re.compile(r"^([a-zA-Z0-9_:]+)(?:\{(.*)\})? (\S+)$")
    seen = 0
    real = (CORPUS / "real-0.5.23" / "metrics" / "busy.txt").read_text().splitlines()
    for line in [*text.splitlines(), *real]:
        if line.startswith("#"):
            continue
        m = sample.match(line)
        assert m, f"not a labelled sample line: {line!r}"
        keys = re.findall(r'(\w+)="', m.group(2) or "")
        assert keys == sorted(keys), f"labels not sorted: {line}"
        assert "." in m.group(3) or m.group(3) in ("+Inf", "NaN"), f"not a float: {line}"
        assert not m.group(1).endswith("_created")
        seen += 1
    assert seen > 150


def test_log_regex_matches_the_captured_forms() -> None:
    """Real lines: recorded here (CPU, no spec), and captured in public (accept len, the
    old '.' form with a trailing ', ', TP tags, the hybrid form rendered from the 0.5.23
    wheel for want of a capture)."""
    for rel in ("real-0.5.23/decode/default.log", "spec/docs_2025-08-31_v0.5.1.post3_"
                "trailing_sep.log", "decode/pr22331_2026-04_tp0.log",
                "hybrid/rendered_v0.5.23_mamba_decode_spec.log"):
        decodes = [ln for ln in corpus_lines(rel) if "Decode batch" in ln]
        assert decodes and all(DECODE_RE.match(ln) for ln in decodes), rel
    hybrid = next(ln for ln in corpus_lines("hybrid/rendered_v0.5.23_mamba_decode_spec.log")
                  if "Decode batch" in ln)
    assert DECODE_RE.match(hybrid)["mamba"] == "48"  # type: ignore[index]
    prefill = next(ln for ln in corpus_lines("real-0.5.23/prefill/default.log"))
    assert not DECODE_RE.match(prefill)
    ready = [ln for ln in corpus_lines("real-0.5.23/startup/default.log") if "fired up" in ln]
    assert ready and READY_RE.match(ready[-1])


def test_log_lines(sim: SimHandle) -> None:
    for _ in range(3):
        chat(sim, max_tokens=500)
    m = sim.wait_log(DECODE_RE.pattern)
    assert m["token"] is not None and m["accept"] is not None and m["rate"] is not None
    assert 1.0 <= float(m["accept"]) <= 4.0
    lines = sim.log_lines()
    assert any(READY_RE.match(line) for line in lines)
    for line in lines:
        assert re.match(PREFIX, line), f"stdout line without the SGLang prefix: {line!r}"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory):
    """A simulator with --api-key, --admin-api-key, hybrid log lines and no metrics flag."""
    handle = start_sim(tmp_path_factory.mktemp("keyed"), *FAST_ARGS, "--api-key", "sk-1",
                       "--admin-api-key", "adm", "--hybrid-log", "--tp-size", "2")
    try:
        yield handle
    finally:
        handle.kill()


def test_api_key(keyed: SimHandle) -> None:
    # a real 401 body, captured in public (sglang issue 25127)
    want = json.loads((CORPUS / "errors" / "issue25127_v0.5.11_401_unauthorized.json")
                      .read_text())
    url = keyed.url
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    for headers in ({}, {"Authorization": "sk-1"}, {"Authorization": "Bearer sk-2"}):
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
        assert resp.status_code == 401
        assert resp.json() == want
    assert httpx.get(f"{url}/server_info").status_code == 401
    assert httpx.post(f"{url}/flush_cache").status_code == 401
    # admin endpoints take the admin key, and then not the API key
    user = {"Authorization": "Bearer sk-1"}
    assert httpx.post(f"{url}/flush_cache", headers=user).status_code == 401
    assert httpx.post(f"{url}/flush_cache",
                      headers={"Authorization": "Bearer adm"}).status_code == 200
    assert httpx.get(f"{url}/server_info", headers=user).status_code == 200
    ok = httpx.post(f"{url}/v1/chat/completions", json=body,
                    headers={"Authorization": "Bearer sk-1"})
    assert ok.status_code == 200
    for path in ("/health", "/health_generate", "/ready"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    assert httpx.get(f"{url}/metrics").status_code == 404  # only with --enable-metrics


def test_hybrid_log_form(keyed: SimHandle) -> None:
    for _ in range(3):
        httpx.post(f"{keyed.url}/generate", json={"text": "x"},
                   headers={"Authorization": "Bearer sk-1"})
    m = keyed.wait_log(DECODE_RE.pattern)
    assert m["full"] is not None and m["mamba"] is not None and m["token"] is None
    assert " TP0] Decode batch" in m.group(0)


def test_loading_then_accept_length_after_decode(tmp_path: Path) -> None:
    """503 while loading (after the port opens), no avg_spec_accept_length before any
    decode, then present once a decode log interval has folded the counters in."""
    handle = start_sim(tmp_path, "--time-scale", "0.1", "--load-seconds", "16",
                       "--decode-log-interval-s", "1", wait_ready=False)
    try:
        codes: list[int] = []
        deadline = time.monotonic() + 20
        while not codes or codes[-1] != 200:
            assert time.monotonic() < deadline and handle.alive(), codes
            try:
                codes.append(httpx.get(f"{handle.url}/health", timeout=5).status_code)
            except httpx.TransportError:
                time.sleep(0.01)  # the port opens once the "weights" are loaded
        assert 503 in codes
        assert codes.index(200) > codes.index(503)
        state = httpx.get(f"{handle.url}/server_info").json()["internal_states"][0]
        assert "avg_spec_accept_length" not in state
        assert state["last_gen_throughput"] == 0
        httpx.post(f"{handle.url}/generate", json={"text": "x",
                                                   "sampling_params": {"max_new_tokens": 64}})
        handle.wait_log(DECODE_RE.pattern)
        state = httpx.get(f"{handle.url}/server_info").json()["internal_states"][0]
        assert 1.0 <= state["avg_spec_accept_length"] <= 4.0
    finally:
        handle.kill()


def test_control_endpoints(sim: SimHandle) -> None:
    url = sim.url
    assert httpx.post(f"{url}/flush_cache").status_code == 200
    assert httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}).status_code == 200
    try:
        assert httpx.get(f"{url}/ready").status_code == 503
        with httpx.Client(timeout=10) as client:
            # a request queued behind the pause makes flush_cache refuse
            out: dict[str, Any] = {}
            t = threading.Thread(target=lambda: out.update(client.post(
                f"{url}/generate", json={"text": "x", "rid": "held"}).json()))
            t.start()

            def queued() -> bool:
                return httpx.get(f"{url}/sim/state").json()["queued"] == 1

            wait_until(queued, 5, "request queued")
            assert httpx.post(f"{url}/flush_cache").status_code == 400
            # health generation goes through the same queue: no output -> 503 after 20 s
            # (scaled by --time-scale 0.001)
            assert httpx.get(f"{url}/health_generate").status_code == 503
            httpx.post(f"{url}/abort_request", json={"rid": "held"})
            t.join(5)
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        httpx.post(f"{url}/continue_generation")
    assert httpx.get(f"{url}/ready").status_code == 200
    assert httpx.get(f"{url}/health_generate").status_code == 200
    assert httpx.post(f"{url}/flush_cache").status_code == 200
