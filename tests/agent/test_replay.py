"""Every sample of real SGLang output through the real agent: one supervisor launches a replay
server per sample (tests/replay_server.py) from its `command` template, reads their logs,
/server_info or /get_server_info and /metrics, and `fleetdeck-agent status --json` must show
the figures a person read off each sample, unknown (None, `–` on screen) where it has none."""

from __future__ import annotations

import json
import math
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.theme import Theme

from agents.rundir.schema import ServerStatus
from console.headless import server_line
from console.tui.widgets.gpu_table import GPU_COLUMNS, gpu_row
from tests.plugins.supervised import agent, kill_run, port_block, wait_status

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
EXPECTED = sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*.expected.json"))
REPLAY = Path(__file__).resolve().parents[1] / "replay_server.py"
FIGURES = ("running_reqs", "queued_reqs", "gen_throughput", "token_usage", "accept_length_log",
           "accept_length_cum", "accept_length_window", "effective_max_running")


def _from_lines(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """A server from its hand-read batch lines: the newest decode line of each DP rank, or,
    with no decode line, the newest prefill line (no generation figures then)."""
    decode = [ln for ln in lines if ln["kind"] == "decode"]
    newest = {ln["ranks"].get("DP"): ln for ln in (decode or lines)}.values()

    def total(key: str) -> Any:
        known = [ln[key] for ln in newest if ln.get(key) is not None]
        return sum(known) if known else None

    usage = [ln["token_usage"] for ln in newest if ln["token_usage"] is not None]
    return {"running_reqs": total("running_reqs"), "queued_reqs": total("queued_reqs"),
            "token_usage": sum(usage) / len(usage) if usage else None,
            "gen_throughput": total("gen_throughput") if decode else None}


def wanted(e: dict[str, Any]) -> dict[str, Any]:
    """The status figures a sample's expected file implies (None: the sample does not say)."""
    want: dict[str, Any] = dict.fromkeys(FIGURES)
    kind = e["kind"]
    if kind in ("log", "startup"):
        combined, last = e.get("combined"), e.get("last_decode")
        if last is not None:
            want.update({k: last[k] for k in ("running_reqs", "queued_reqs", "gen_throughput",
                                              "token_usage", "accept_length_log")})
        elif combined is not None and "gen_throughput" in combined:
            want.update({k: combined[k] for k in ("running_reqs", "queued_reqs",
                                                  "gen_throughput", "accept_length_log")})
            want["token_usage"] = combined["token_usage_mean"]
        elif e.get("lines"):
            want.update(_from_lines(e["lines"]))
        startup = e.get("startup", e)
        want["effective_max_running"] = startup.get("max_running_requests")
    elif kind == "metrics":
        want.update({k: e.get(k) for k in ("running_reqs", "queued_reqs", "gen_throughput",
                                            "token_usage")})
        want["accept_length_window"] = e["spec_accept_length"]
        want["effective_max_running"] = e.get("max_running_requests")
    elif kind == "server_info":
        want["gen_throughput"] = e["last_gen_throughput"]
        want["accept_length_cum"] = e["accept_length_cum"]
        per_dp = e["effective_max_running_requests_per_dp"]
        want["effective_max_running"] = (per_dp * e["num_internal_states"] if per_dp is not None
                                         else e["max_running_requests"])
    return want


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One supervised run with a replay server per sample (GPU i replays sample i); the
    status snapshot once every server is healthy and its figures were read."""
    root = tmp_path_factory.mktemp("replay")
    listing = root / "samples.txt"
    listing.write_text("\n".join(EXPECTED) + "\n")
    # No prompts: the engine refuses to start, the servers stay up and are watched.
    (root / "prompts.jsonl").write_text("")
    n = len(EXPECTED)
    command = (f"{shlex.quote(sys.executable)} {shlex.quote(str(REPLAY))} --port {{port}} "
               f"--samples {shlex.quote(str(listing))} --index {{gpu}}")
    (root / "run.toml").write_text("\n".join([
        "[run]", 'name = "replay"', 'dir = "run"', "", "[servers]",
        f"gpus = {list(range(n))}", f"base_port = {port_block(n)}", 'model = "replay"',
        f"command = {json.dumps(command)}", "startup_timeout_s = 120",
        "health_interval_s = 0.5", "health_timeout_s = 10", "", "[generate]",
        'prompts = "prompts.jsonl"', ""]))
    run_dir = root / "run"
    r = agent("up", str(root / "run.toml"))
    assert r.returncode == 0, r.stderr
    try:
        yield wait_status(run_dir, lambda s: len(s["servers"]) == n and all(
            x["state"] == "healthy" and x["metrics_at"] is not None
            and x["metrics_at"] > (x["health_checked_at"] or 0) - 60 for x in s["servers"]),
            180, f"{n} replay servers healthy with their figures read")
    finally:
        agent("down", str(run_dir), "--yes")
        kill_run(run_dir)


def close(got: Any, want: Any, tol: float) -> bool:
    if want is None or got is None:
        return got is want
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=tol)


@pytest.mark.parametrize("name", EXPECTED, ids=lambda n: n[:-14])
def test_status_shows_the_samples_figures(replayed: dict[str, Any], name: str) -> None:
    e = json.loads((CORPUS / name).read_text())
    server = next(s for s in replayed["servers"] if s["gpu"] == EXPECTED.index(name))
    tol = e.get("tolerance", {})
    want = wanted(e)
    for key, value in want.items():
        leaf = "accept_length_log" if key.startswith("accept") else key
        assert close(server[key], value, tol.get(leaf, 1e-9)), \
            f"{name}: status {key} = {server[key]!r}, the sample says {value!r}"
    if e["kind"] == "error_body":
        message = e.get("message") or e.get("error") or e.get("detail")
        assert message in (server["last_error"] or ""), server["last_error"]
        assert f"/server_info answered {e['http_status']}" in server["last_error"]
        if e["http_status"] == 404:  # then the old route is asked too
            assert "/get_server_info answered 404" in server["last_error"]
    if e["kind"] == "server_info" and e["endpoint"] == "/get_server_info":
        assert server["last_error"] is None  # a 404 on /server_info is how <= 0.5.5 answers
    # Unknown is shown as unknown: `–` in the headless console and the TUI, never 0.
    status = msgspec.convert(server, ServerStatus)
    line = server_line(status)
    for label, key in (("running", "running_reqs"), ("queue", "queued_reqs")):
        shown = "–" if want[key] is None else str(want[key])
        assert f"{label} {shown}," in line, line
    assert (want["gen_throughput"] is None) == (" – tok/s" in line), line
    assert (want["token_usage"] is None) == ("KV –" in line), line
    columns = [c[0] for c in GPU_COLUMNS]
    row = gpu_row(status, replayed["updated_at"], Theme("t", "#00ff00"), False)
    cells = dict(zip(columns, (c.plain for c in row), strict=True))
    assert (cells["queue"] == "–") == (want["queued_reqs"] is None), cells
    # No engine sends to it: tok/s is SGLang's own throughput, or unknown.
    assert (cells["tok_s"] == "–") == (want["gen_throughput"] is None), cells
    accepts = ("accept_length_log", "accept_length_cum", "accept_length_window")
    assert (cells["accept"] == "–") == all(want[k] is None for k in accepts), cells
