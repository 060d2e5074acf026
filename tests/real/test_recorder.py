"""The golden recorder (scripts/record_sglang_goldens.py) against the tier's shared server:
it still records every kind of file the committed goldens hold (tests/fixtures/sglang/
real-0.5.23/, its default profile), in the same shapes, so that it cannot silently break
before the next recording. What a server started by the recorder alone shows (its health
from the launch) and the small-KV and overload profiles, which need servers of their own,
are not run here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agents.supervise.sglang_log import LogReader, parse_batch_line
from tests.real.server import RealServer
from tests.sim.realgoldens import (
    REPO,
    differences,
    families,
    load,
    manifest,
    shape,
    sse_events,
)

SCRIPT = REPO / "scripts" / "record_sglang_goldens.py"
NULLABLE = frozenset({"cached_tokens_details"})
BY_CONTENT = frozenset({"decode_throughput", "first_token_latency"})
BUDGET_S = 240.0  # 20-60 s on this box at a load of 20; the tier's machine is shared


def committed() -> dict[str, dict[str, Any]]:
    """The default profile's files that a running server (no launch seen) gives."""
    return {rel: e for rel, e in manifest()["files"].items()
            if e["profile"] == "default" and e["kind"] != "health_runs"}


def log_fields(text: str) -> set[tuple[str, frozenset[str]]]:
    out = set()
    for line in text.splitlines():
        rec = parse_batch_line(line)
        assert rec is not None, line
        names = {k for k in ("running_reqs", "queued_reqs", "num_tokens", "token_usage",
                             "gen_throughput", "graph", "new_seqs", "new_tokens",
                             "cached_tokens", "pending_tokens", "input_throughput")
                 if getattr(rec, k) is not None}
        out.add((rec.kind, frozenset(names)))
    return out


def same_shape(rel: str, old: Any, got: Any) -> None:
    diffs = [d for d in differences(shape(old), shape(got), NULLABLE)
             if not any(f".{k}:" in d for k in BY_CONTENT)]
    assert not diffs, f"{rel}:\n  " + "\n  ".join(diffs)


def same_kind(rel: str, entry: dict[str, Any], out: Path) -> None:
    new = out / rel
    assert new.is_file(), f"{rel}: not recorded"
    kind = entry["kind"]
    if kind == "exchange":
        old, got = load(rel), json.loads(new.read_text())
        assert (got["request"]["method"], got["request"]["path"], got["status"]) == (
            old["request"]["method"], old["request"]["path"], old["status"]), rel
        if "body" in old:
            same_shape(rel, old["body"], got.get("body"))
        elif old["text"].startswith("data: "):  # a stream: its first and last events
            a, b = sse_events(old["text"]), sse_events(got["text"])
            for i in (0, -2, -1):
                same_shape(f"{rel} event {i}", a[i], b[i])
        else:
            assert got["text"] == old["text"], rel
    elif kind == "server_info":
        same_shape(rel, load(rel), json.loads(new.read_text()))
    elif kind == "metrics":
        old_f, new_f = families(load(rel)), families(new.read_text())
        for name, (typ, labels, _) in old_f.items():
            assert name in new_f, f"{rel}: {name} no longer exposed"
            assert new_f[name][:2] == (typ, labels), (rel, name)
    elif kind == "log":
        assert log_fields(new.read_text()) == log_fields(load(rel)), rel
    elif kind == "startup":
        def facts(text: str) -> tuple[bool, bool, set[str]]:
            reader = LogReader()
            reader.feed_text(text)
            st = reader.startup
            return st.ready, st.uvicorn_url is not None, set(st.capacity)
        assert facts(new.read_text()) == facts(load(rel)), rel
    else:
        raise AssertionError(f"{rel}: a kind this test does not know: {kind}")


# The first test of the tier to ask for the shared server pays its start-up (50-250 s).
@pytest.mark.timeout(900)
def test_the_recorder_records_every_kind_of_golden_from_the_shared_server(
        server: RealServer, tmp_path: Path) -> None:
    before = server.metrics()
    out = tmp_path / "goldens"
    began = time.monotonic()
    run = subprocess.run([sys.executable, str(SCRIPT), "--url", server.url, "--log",
                          str(server.log_path), "--out", str(out)], capture_output=True,
                         text=True, timeout=BUDGET_S, cwd=REPO)
    took = time.monotonic() - began
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["out"] == str(out)
    want = committed()
    got = json.loads((out / "manifest.json").read_text())
    assert set(got["files"]) == set(want), set(got["files"]) ^ set(want)
    assert got["servers"]["default"]["version"] == server.server_info()["version"]
    for rel, entry in sorted(want.items()):
        assert got["files"][rel]["kind"] == entry["kind"], rel
        same_kind(rel, entry, out)
    # What it recorded is what the server counted: the requests it aborted by rid (two of
    # them recorded, whose answers say so), and every token of the answers it kept.
    after = server.metrics()
    aborted = [json.loads((out / f"bodies/{n}_aborted.json").read_text())["body"]
               for n in ("chat", "generate")]
    assert aborted[0]["choices"][0]["finish_reason"] == "abort"
    assert aborted[1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert after.delta(before, "num_aborted_requests_total") == summary["aborted"] >= 2
    kept = sum(ex["body"]["usage"]["completion_tokens"] if "usage" in ex["body"] else
               ex["body"]["meta_info"]["completion_tokens"]
               for p in sorted((out / "bodies").glob("*.json"))
               if isinstance((ex := json.loads(p.read_text())).get("body"), dict)
               and ex["status"] == 200 and ("usage" in ex["body"] or "meta_info" in ex["body"]))
    assert after.delta(before, "generation_tokens_total") >= kept > 0
    print(f"recorder: {took:.1f} s")
