"""What a real SGLang 0.5.23 server wrote (tests/fixtures/sglang/real-0.5.23/, recorded by
scripts/record_sglang_goldens.py) through the supervisor's readers: every decode and prefill
line gives back every figure it prints, the start-up log its capacity, and every /metrics name
the supervisor reads is one the real server exports (the others are documented fallbacks of
older servers). The live counterpart is tests/real/test_supervise_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.supervise.sglang_log import parse_batch_line, read_log
from agents.supervise.sglang_metrics import parse_exposition, read_metrics, read_server_info

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "real-0.5.23"


def _lines(name: str) -> list[str]:
    lines = (REAL / name).read_text().splitlines()
    assert lines, f"{name}: no lines recorded"
    return lines


@pytest.mark.parametrize("name", ["decode/default.log", "decode/small-kv.log"])
def test_real_decode_lines_give_back_every_figure_they_print(name: str) -> None:
    for line in _lines(name):
        rec = parse_batch_line(line)
        assert rec is not None and rec.kind == "decode", line
        assert rec.timestamp is not None and rec.ranks == {} and rec.extras == {}
        assert rec.accept_length_log is None and rec.accept_rate is None  # no spec decoding
        # The record, printed as 0.5.23 prints it, is the line: no figure lost or misread.
        assert rec.graph is not None and rec.token_usage is not None
        assert rec.gen_throughput is not None
        assert line == (f"[{rec.timestamp}] Decode batch, #running-req: {rec.running_reqs}, "
                        f"#token: {rec.num_tokens}, token usage: {rec.token_usage:.2f}, "
                        f"{rec.graph_label}: {rec.graph}, gen throughput (token/s): "
                        f"{rec.gen_throughput:.2f}, #queue-req: {rec.queued_reqs}")
        assert rec.graph_label == "cpu graph" and rec.graph is False


@pytest.mark.parametrize("name", ["prefill/default.log", "prefill/small-kv.log"])
def test_real_prefill_lines_give_back_every_figure_they_print(name: str) -> None:
    for line in _lines(name):
        rec = parse_batch_line(line)
        assert rec is not None and rec.kind == "prefill", line
        assert rec.token_usage is not None and rec.input_throughput is not None
        assert line == (f"[{rec.timestamp}] Prefill batch, #new-seq: {rec.new_seqs}, "
                        f"#new-token: {rec.new_tokens}, #cached-token: {rec.cached_tokens}, "
                        f"token usage: {rec.token_usage:.2f}, #running-req: {rec.running_reqs}, "
                        f"#queue-req: {rec.queued_reqs}, #pending-token: {rec.pending_tokens}, "
                        f"{rec.graph_label}: {rec.graph}, input throughput (token/s): "
                        f"{rec.input_throughput:.2f}")


def test_a_retraction_line_is_not_a_batch_line() -> None:
    for line in _lines("decode/small-kv_retract.log"):
        assert "Retract requests" in line and parse_batch_line(line) is None


@pytest.mark.parametrize("profile", ["default", "small-kv"])
def test_the_real_start_up_log_gives_its_capacity_and_readiness(profile: str) -> None:
    reader = read_log(REAL / "startup" / f"{profile}.log")
    st = reader.startup
    info = read_server_info(json.loads((REAL / "server_info" / f"{profile}.json"
                                        if profile != "default"
                                        else REAL / "server_info" / "server_info.json")
                                       .read_text()))
    assert st.ready and st.capacity_line is not None and st.uvicorn_url is not None
    assert st.capacity_line < st.uvicorn_line < st.ready_line  # type: ignore[operator]
    assert st.capacity["max_total_num_tokens"] == info.max_total_num_tokens
    assert st.max_running_requests == info.effective_max_running
    # A CPU build says available_cpu_mem (a GPU one available_gpu_mem): GB either way.
    assert st.capacity["available_cpu_mem_gb"] > 0
    assert reader.records == [] or all(r.kind == "prefill" for r in reader.records)


def test_the_real_server_info_reads_as_the_server_it_is() -> None:
    info = read_server_info(json.loads((REAL / "server_info" / "server_info.json").read_text()))
    assert info.version == "0.5.23" and info.internal_states_form == "list"
    assert info.num_internal_states == 1 and info.dp_size == 1 and info.tp_size == 1
    assert info.max_running_requests is None  # not given at launch: SGLang chose
    assert info.effective_max_running == info.effective_max_running_requests_per_dp == 4096
    assert info.last_gen_throughput == 0.0 and info.accept_length_cum is None
    assert not info.placeholder


# The sglang: names the supervisor reads (sglang_metrics.read_metrics), by the field they fill:
# gauges, exported from the start, and counters, exported once a first request has finished.
GAUGES = {"running_reqs": "num_running_reqs", "queued_reqs": "num_queue_reqs",
          "gen_throughput": "gen_throughput", "token_usage": "token_usage",
          "num_used_tokens": "num_used_tokens", "cache_hit_rate": "cache_hit_rate",
          "max_total_num_tokens": "max_total_num_tokens", "context_len": "context_len"}
COUNTERS = {"prompt_tokens_total": "prompt_tokens_total",
            "generation_tokens_total": "generation_tokens_total"}
# Read only from servers before the rename (late 2024), or only with speculative decoding.
FALLBACKS = {"num_requests_running", "num_requests_waiting", "max_running_requests"}


@pytest.mark.parametrize("name", ["busy.txt", "idle.txt", "small-kv_queued.txt"])
def test_every_metric_the_supervisor_reads_is_one_the_real_server_exports(name: str) -> None:
    text = (REAL / "metrics" / name).read_text()
    exported = {s.name for s in parse_exposition(text)}
    m = read_metrics(text)
    assert m.name_generation == "new" and not m.ranked
    served = "num_requests_total" in exported
    # idle.txt is a server that has answered nothing yet: no counter exported, none known.
    assert served == (name != "idle.txt")
    for attr, metric in (GAUGES | COUNTERS if served else GAUGES).items():
        assert metric in exported, f"{metric}: not exported by 0.5.23"
        assert getattr(m, attr) is not None, f"{attr} (from {metric}) unread"
    if not served:
        assert all(getattr(m, attr) is None for attr in COUNTERS)
    assert not FALLBACKS & exported
    assert m.max_running_requests is None
    # Exported as 0.0 without speculative decoding: unknown, not an accept length of 0.
    assert "spec_accept_length" in exported and m.spec_accept_length is None
    assert set(m.labels) == {"engine_type", "model_name"}
