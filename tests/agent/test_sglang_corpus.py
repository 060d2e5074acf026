"""Every sample of real SGLang output in tests/fixtures/sglang/ through the agent's readers,
compared with the figures a person read off it by hand (its `.expected.json`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from agents.supervise.sglang_log import (
    LAUNCH_MARKER,
    BatchRecord,
    LogReader,
    LogTail,
    parse_batch_line,
    read_log,
)
from agents.supervise.sglang_metrics import (
    read_error_body,
    read_metrics,
    read_server_info,
    server_figures,
)

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
EXPECTED = sorted(CORPUS.rglob("*.expected.json"))
# Keys that describe the sample, not a figure a reader gives.
META = {"sample", "kind", "sglang_version", "rendered", "notes", "tolerance", "endpoint",
        "http_status"}
# Given in an expected file for comparison only (the naive combination).
COMPARISON_ONLY = {"accept_length_log_throughput_weighted_mean"}

DECODE_KEYS = ("running_reqs", "queued_reqs", "num_tokens", "token_usage", "gen_throughput",
               "accept_length_log", "accept_rate", "graph", "graph_label")
PREFILL_KEYS = ("new_seqs", "new_tokens", "cached_tokens", "token_usage", "running_reqs",
                "queued_reqs", "pending_tokens", "input_throughput", "graph", "graph_label")
FIGURE_KEYS = ("running_reqs", "queued_reqs", "num_tokens", "token_usage", "gen_throughput",
               "accept_length_log", "accept_rate", "graph")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def sample_of(expected: dict[str, Any]) -> Path:
    return CORPUS / expected["sample"]


def record_dict(rec: BatchRecord, line: int) -> dict[str, Any]:
    keys = DECODE_KEYS if rec.kind == "decode" else PREFILL_KEYS
    return {"line": line, "kind": rec.kind, "timestamp": rec.timestamp, "ranks": rec.ranks,
            **{k: getattr(rec, k) for k in keys}, **rec.extras}


def figures_dict(rec: BatchRecord) -> dict[str, Any]:
    return {k: getattr(rec, k) for k in FIGURE_KEYS}


def log_reading(path: Path) -> dict[str, Any]:
    reader = read_log(path)
    decodes = [r for r in reader.records if r.kind == "decode"]
    st = reader.startup
    combined = reader.combined()
    out: dict[str, Any] = {
        "lines": [record_dict(r, n) for r, n in zip(reader.records, reader.record_lines,
                                                     strict=True)],
        "ready_line": st.ready_line, "ready": st.ready, "capacity_line": st.capacity_line,
        "uvicorn_line": st.uvicorn_line, "uvicorn_url": st.uvicorn_url, **st.capacity,
        "last_decode": figures_dict(decodes[-1]) if decodes else None,
        "newest_line_only": figures_dict(decodes[-1]) if decodes else None,
        "per_rank_latest": {f"DP{k}": figures_dict(r) for k, r in reader.decode.items()},
        "combined": dataclasses.asdict(combined) if combined is not None else None,
    }
    out["startup"] = {**st.capacity, "uvicorn_url": st.uvicorn_url, "ready": st.ready}
    return out


def reading(expected: dict[str, Any]) -> dict[str, Any]:
    """What the agent's readers make of the sample, under the expected file's names."""
    path = sample_of(expected)
    kind = expected["kind"]
    if kind in ("log", "startup"):
        return log_reading(path)
    if kind == "metrics":
        return dataclasses.asdict(read_metrics(path.read_text()))
    if kind == "server_info":
        return dataclasses.asdict(read_server_info(json.loads(path.read_text())))
    if kind == "error_body":
        body = read_error_body(path.read_text())
        return {"is_json": body.is_json, **{k: body.fields.get(k) for k in (
            "error", "message", "object", "type", "code", "detail")},
            "message": body.message if "message" in body.fields else None}
    raise AssertionError(f"{path}: unknown kind {kind!r}")


def same(want: Any, got: Any, tol: dict[str, float], where: str) -> None:
    """`got` holds every key of `want` with the same value (numbers within the key's
    tolerance, else as printed); a bool is a bool and None is None, never 0."""
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: expected an object, got {got!r}"
        for key, value in want.items():
            if key in COMPARISON_ONLY:
                continue
            assert key in got, f"{where}.{key}: the reader gives no such figure"
            same(value, got[key], tol, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), \
            f"{where}: expected {len(want)} items, got {got!r}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            same(w, g, tol, f"{where}[{i}]")
    elif want is None or isinstance(want, bool | str):
        assert got == want and type(got) is type(want), f"{where}: expected {want!r}, got {got!r}"
    else:
        assert isinstance(got, int | float) and not isinstance(got, bool), \
            f"{where}: expected {want!r}, got {got!r}"
        leaf = where.rsplit(".", 1)[-1].split("[")[0]
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=tol.get(leaf, 1e-9)), \
            f"{where}: expected {want!r}, got {got!r}"


def test_the_corpus_is_all_there() -> None:
    shapes: dict[str, int] = {}
    for path in EXPECTED:
        expected = load(path)
        assert sample_of(expected).is_file(), f"{path}: its sample {expected['sample']} is missing"
        shapes[path.parent.name] = shapes.get(path.parent.name, 0) + 1
    assert shapes == {"decode": 10, "prefill": 1, "spec": 4, "hybrid": 4, "multirank": 5,
                      "startup": 2, "metrics": 5, "server_info": 5, "errors": 3}


@pytest.mark.parametrize("path", EXPECTED, ids=lambda p: f"{p.parent.name}/{p.name[:-14]}")
def test_sample_reads_as_expected(path: Path) -> None:
    expected = load(path)
    got = reading(expected)
    want = {k: v for k, v in expected.items() if k not in META}
    same(want, got, expected.get("tolerance", {}), expected["sample"])
    if "lines" in want:  # extras only where printed: nothing more than the person read
        for w, g in zip(want["lines"], got["lines"], strict=True):
            assert set(g) == set(w), f"{expected['sample']} line {w['line']}: {set(g) ^ set(w)}"


# ----- beyond the corpus: forms described from source, and the reader's own behaviour ------

def test_whole_keys_block_accept_len_is_not_accept_len() -> None:
    # 0.5.23's DSpark fields, as metrics_reporter.py prints them (SOURCES.md, decode field 3).
    rec = parse_batch_line("[2026-09-01 12:00:00] Decode batch, #running-req: 4, #token: 900, "
                           "token usage: 0.01, cap len: 6.00, block accept len: 5.10, "
                           "cuda graph: True, gen throughput (token/s): 80.00, "
                           "#queue-req: 0, fwd occupancy: 41.0%")
    assert rec is not None and rec.accept_length_log is None and rec.queued_reqs == 0
    rec = parse_batch_line("Decode batch, #running-req: 4, block accept len: 5.10, "
                           "accept len: 2.50, musa graph: False, gen throughput (token/s): 9")
    assert rec is not None and rec.accept_length_log == 2.5
    assert (rec.graph, rec.graph_label) == (False, "musa graph")


def test_mini_load_balancer_placeholder_is_unknown_not_zero() -> None:
    # sglang/srt/disaggregation/mini_lb.py (0.4.10.post2): no decode server has state yet.
    info = read_server_info({"internal_states": [{"last_gen_throughput": 0.0,
                                                  "avg_spec_accept_length": None}]})
    assert info.placeholder and info.last_gen_throughput is None
    assert server_figures(info, None, None).gen_throughput is None
    real = read_server_info({"version": "0.5.5", "internal_states": [
        {"last_gen_throughput": 0.0}, {"last_gen_throughput": 0.0}]})
    assert not real.placeholder and real.last_gen_throughput == 0.0


def test_several_internal_states_add_up() -> None:
    info = read_server_info({"version": "0.5.9", "dp_size": 2, "internal_states": [
        {"last_gen_throughput": 300.0, "avg_spec_accept_length": 3.0,
         "effective_max_running_requests_per_dp": 24},
        {"last_gen_throughput": 100.0, "avg_spec_accept_length": 2.0,
         "effective_max_running_requests_per_dp": 24}]})
    assert info.last_gen_throughput == 400.0 and info.effective_max_running == 48
    assert info.accept_length_cum == pytest.approx(400 / (100 + 50))


def test_unranked_metrics_of_a_dp_server_yield_to_the_log() -> None:
    """0.4.4-0.4.9 with --dp-size 2: one `mostrecent` series is one rank, not the server."""
    metrics = read_metrics('sglang:num_running_reqs{model_name="m"} 8.0\n'
                           'sglang:gen_throughput{model_name="m"} 150.0\n')
    reader = LogReader()
    reader.feed_text(
        "[2025-05-31 18:31:21 DP0 TP0] Decode batch. #running-req: 8, #token: 3, token usage: "
        "0.10, gen throughput (token/s): 100.00, #queue-req: 1\n"
        "[2025-05-31 18:31:22 DP1 TP1] Decode batch. #running-req: 8, #token: 3, token usage: "
        "0.30, gen throughput (token/s): 150.00, #queue-req: 0\n")
    dp2 = read_server_info({"version": "0.4.6", "dp_size": 2, "last_gen_throughput": 150.0})
    fig = server_figures(dp2, metrics, reader.combined())
    assert (fig.running_reqs, fig.queued_reqs, fig.gen_throughput) == (16, 1, 250.0)
    assert fig.token_usage == pytest.approx(0.2)
    one = read_server_info({"version": "0.4.6", "dp_size": 1, "last_gen_throughput": 150.0})
    assert server_figures(one, metrics, reader.combined()).running_reqs == 8


def test_a_rank_that_stopped_logging_no_longer_counts() -> None:
    reader = LogReader(stale_s=60)
    reader.feed_text(
        "[2025-05-31 18:00:00 DP1 TP1] Decode batch. #running-req: 5, #token: 3, token usage: "
        "0.10, gen throughput (token/s): 50.00, #queue-req: 0\n"
        "[2025-05-31 18:31:21 DP0 TP0] Decode batch. #running-req: 8, #token: 3, token usage: "
        "0.10, gen throughput (token/s): 100.00, #queue-req: 0\n")
    combined = reader.combined()
    assert combined is not None and combined.ranks_seen == 1 and combined.running_reqs == 8


def test_log_tail_follows_a_growing_log_and_starts_over_at_a_launch(tmp_path: Path) -> None:
    log = tmp_path / "sglang_gpu0.log"
    line = ("[2026-04-05 20:02:51{tag}] Decode batch, #running-req: {n}, #token: 1, token "
            "usage: 0.08, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0\n")
    log.write_text(line.format(tag=" DP0 TP0", n=3) + line.format(tag=" DP1 TP1", n=4)[:40])
    tail = LogTail(log)
    combined = tail.poll().combined()
    assert combined is not None and combined.running_reqs == 3  # the half line waits
    with open(log, "a") as f:
        f.write(line.format(tag=" DP1 TP1", n=4)[40:])
    combined = tail.poll().combined()
    assert combined is not None and combined.running_reqs == 7
    with open(log, "a") as f:
        f.write(f"\n{LAUNCH_MARKER} at 2026-04-05 20:03:00\n")
    assert tail.poll().combined() is None  # a new process: the old lines say nothing of it
    with open(log, "a") as f:
        f.write(line.format(tag="", n=2))
    combined = tail.poll().combined()
    assert combined is not None and combined.running_reqs == 2
    log.write_text(line.format(tag="", n=9))  # replaced by a shorter file
    combined = tail.poll().combined()
    assert combined is not None and combined.running_reqs == 9


def test_log_tail_of_a_long_log_reads_only_its_end(tmp_path: Path) -> None:
    log = tmp_path / "sglang_gpu0.log"
    filler = "[2026-04-05 20:02:51] INFO:     127.0.0.1:1 - \"GET /metrics HTTP/1.1\" 200 OK\n"
    with open(log, "w") as f:
        f.write("[2026-04-05 20:02:50] Decode batch, #running-req: 1, gen throughput "
                "(token/s): 1.00, #queue-req: 0\n")
        f.write(filler * (2 * (1 << 20) // len(filler)))
        f.write("[2026-04-05 20:02:52] Decode batch, #running-req: 5, gen throughput "
                "(token/s): 5.00, #queue-req: 0\n")
    tail = LogTail(log)
    reader = tail.poll()
    assert tail.offset == os.path.getsize(log)
    assert reader.lines < 2 * (1 << 20) // len(filler)
    combined = reader.combined()
    assert combined is not None and combined.running_reqs == 5
