"""`fleetdeck dataset`: a finished run pulled by the real `fleetdeck pull` (a local node: the
agent's `serve --stdio` as a subprocess, the same bytes as SSH), exported with the real CLI and
loaded by the real consumer, `datasets`, offline. The run holds a retried index (attempt 2
supersedes attempt 1), failed indices, a hedge's winner and a deadline's retry; the export
holds each index's current line once, failures apart. A copy edited after the pull, a run
still running and a hostile batch line are refused by name. A campaign of two nodes exports
its committed lines only (through its commits, from the real SeaweedFS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agents.rundir.schema import Progress
from tests.servers.s3 import running_s3

FLEETDECK = [sys.executable, "-m", "console.cli"]
LINES = 24
FAILED = (20, 21)  # failed: no line
RETRIED = 3  # attempt 1 cut at max_tokens, attempt 2 in a later batch
HEDGED = 5
DEADLINE = 7  # its attempt-1 copy missed a deadline and was sent again


def line(i: int, attempt: int = 1, finish: str = "stop", tokens: int = 100,
         hedged: bool = False, content: str | None = None) -> dict[str, Any]:
    return {"v": 1, "index": i, "id": f"p{i}",
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": f"question {i}", "name": "u"}],
            "reasoning_content": f"thinking about {i}",
            "content": content if content is not None else f"answer {i} attempt {attempt}",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
            if i == 1 else None,
            "tools": [{"type": "function", "function": {"name": "f"}}] if i == 1 else None,
            "finish_reason": finish,
            "usage": {"prompt_tokens": 12, "completion_tokens": tokens, "reasoning_tokens": 5},
            "model": "tiny", "sampling": {"temperature": 0.6}, "chat_template_kwargs": {},
            "max_tokens": 4096 if attempt == 1 else 8192, "server": i % 2, "latency_s": 1.0,
            "attempt": attempt, "hedged": hedged}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def make_run(run_dir: Path, status: str = "done") -> None:
    """A finished run's directory as the engine leaves it (no [s3])."""
    comp = run_dir / "completions"
    comp.mkdir(parents=True)
    prompts = run_dir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]})
                               + "\n" for i in range(LINES)))
    (run_dir / "run.toml").write_text(
        f'[run]\nname = "r1"\nkind = "generate"\ndir = "{run_dir}"\n\n'
        f'[servers]\nurls = ["http://127.0.0.1:9"]\n\n'
        f'[generate]\nprompts = "{prompts}"\nmodel = "tiny"\n')
    (run_dir / "run.pin.json").write_text(json.dumps({
        "prompts_path": str(prompts), "prompts_sha256": "ab" * 32, "prompts_lines": LINES,
        "prompts_size": 1, "prompts_mtime_ns": 1, "model": "tiny",
        "sampling": {"temperature": 0.6}, "chat_template_kwargs": {}, "created_at": 1.0}))
    first = [line(i, finish="length" if i == RETRIED else "stop",
                  tokens=4096 if i == RETRIED else 100 + i, hedged=i == HEDGED)
             for i in range(12)]
    second = [line(i, tokens=100 + i) for i in range(12, 20)] + \
        [line(RETRIED, attempt=2, tokens=5000)]
    (comp / "completions_000000.jsonl").write_bytes(jsonl(first))
    (comp / "completions_000001.jsonl").write_bytes(jsonl(second))
    done = [f"{i}\n" for i in range(20) if i != RETRIED] + [f"{RETRIED}\n", f"{RETRIED} 2\n"]
    (comp / ".done_indices").write_text("".join(done))
    events = [{"event": "requeued", "time": 1.0, "index": DEADLINE, "attempt": 1,
               "what": "deadline", "server": 0, "message": "deadline 30 s missed"},
              {"event": "failed", "time": 2.0, "index": FAILED[0], "error": "http_500",
               "message": "Internal Server Error", "attempts": 3, "server": 1, "attempt": 1},
              {"event": "failed", "time": 3.0, "index": FAILED[1], "error": "deadline",
               "message": "deadline missed", "attempts": 3, "server": 0, "attempt": 1}]
    (run_dir / "failures.jsonl").write_bytes(jsonl(events))
    progress = Progress(total=LINES, completed=20, failed=2, rate_per_sec=0.0, eta_hours=None,
                        total_input_tokens=0, total_output_tokens=0, avg_output_tokens=0.0,
                        elapsed_hours=1.5, s3_uploaded=0, s3_bytes=0, status=status,
                        truncated=0, empty=0, max_tokens=4096, concurrency=8, in_flight=0,
                        retried=1, s3_pending=0, control_rev=1, updated_at=1.0, servers={},
                        run="r1", gpus=2, gpu_hours=3.0)
    (run_dir / "progress.json").write_bytes(msgspec.json.encode(progress))
    (run_dir / "provenance.json").write_text(json.dumps({"v": 1, "captures": [{
        "captured_at": 1.0, "model": "tiny", "model_dir": None, "model_files":
        {"config.json": "cd" * 32}, "model_files_note": None, "sglang_version": "0.5.6",
        "server_args": {"api_key": "<redacted>"}, "launch_command": "python -m sglang...",
        "sampling": {}, "chat_template_kwargs": {}, "reasoning_parser": "qwen3",
        "max_tokens": 4096}]}))


def fleet_file(tmp: Path, run_dir: Path) -> Path:
    path = tmp / "fleet.toml"
    path.write_text(f'[console]\npull_dir = "{tmp / "pulls"}"\n\n[[nodes]]\nname = "gen-1"\n'
                    f'local = true\nrun_dir = "{run_dir}"\n'
                    f'agent = "{sys.executable} -m agents.cli"\n')
    return path


def env(tmp: Path) -> dict[str, str]:
    """The real consumer, offline, its cache in the test's folder."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(tmp / "hf"), "PYTHONPATH": str(Path.cwd())}


def fleetdeck(fleet: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETDECK, "--fleet", str(fleet), *args], capture_output=True,
                          text=True, timeout=600, env=env(tmp))


@pytest.fixture
def pulled(tmp_path: Path) -> tuple[Path, Path]:
    """The run, pulled with `fleetdeck pull --all` (every batch: a run without [s3])."""
    run_dir = tmp_path / "node" / "r1"
    make_run(run_dir)
    fleet = fleet_file(tmp_path, run_dir)
    got = fleetdeck(fleet, "pull", "gen-1", "--all", tmp=tmp_path)
    assert got.returncode == 0, got.stderr
    return fleet, tmp_path / "pulls" / "gen-1" / "r1"


def load_both(out: Path, tmp: Path) -> dict[str, Any]:
    """Both ways the Hub's users load it, in a fresh interpreter, offline."""
    code = f"""
import json, datasets
a = datasets.load_dataset("parquet", data_dir={str(out / "data")!r}, split="train")
b = datasets.load_dataset({str(out)!r}, split="train")
rows = sorted(b, key=lambda r: r["index"])
print(json.dumps({{"a": len(a), "b": len(b), "rows": rows, "features": list(b.features)}}))
"""
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=env(tmp))
    assert got.returncode == 0, got.stderr[-3000:]
    result: dict[str, Any] = json.loads(got.stdout.strip().splitlines()[-1])
    return result


def test_a_pulled_run_becomes_a_dataset_the_hub_loads(pulled: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    fleet, copy = pulled
    out = tmp_path / "ds"
    got = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), "--shard-mb", "0.0005",
                    tmp=tmp_path)
    assert got.returncode == 0, got.stderr
    summary = json.loads(got.stdout.strip().splitlines()[-1])
    assert (summary["rows"], summary["failed"], summary["superseded"]) == (20, 2, 1)
    assert summary["shards"] > 1, "a small --shard-mb makes several shards"
    shards = sorted(p.name for p in (out / "data").iterdir())
    assert shards[0] == f"train-00000-of-{summary['shards']:05d}.parquet"

    loaded = load_both(out, tmp_path)
    assert loaded["a"] == loaded["b"] == 20
    rows = {r["index"]: r for r in loaded["rows"]}
    assert sorted(rows) == list(range(20)), "each index once; failed ones out"
    # Checked against the batch files themselves.
    batches = [json.loads(x) for p in sorted((copy / "completions").glob("completions_*"))
               for x in p.read_text().splitlines()]
    current = {}
    for b in batches:
        if b["index"] not in current or b["attempt"] > current[b["index"]]["attempt"]:
            current[b["index"]] = b
    for i in (0, 1, RETRIED, HEDGED, 19):
        r, b = rows[i], current[i]
        assert (r["content"], r["reasoning"], r["attempt"], r["finish_reason"]) == \
            (b["content"], b["reasoning_content"], b["attempt"], b["finish_reason"])
        assert [(m["role"], m["content"]) for m in r["messages"]] == \
            [(m["role"], m["content"]) for m in b["messages"]]
        assert json.loads(r["messages"][1]["extra"]) == {"name": "u"}
        assert r["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    assert rows[RETRIED]["content"] == f"answer {RETRIED} attempt 2", "highest attempt wins"
    assert rows[HEDGED]["hedged"] and not rows[0]["hedged"]
    assert json.loads(rows[1]["tool_calls"])[0]["function"]["name"] == "f"
    assert rows[0]["tool_calls"] is None

    fails = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["index"], f["error"]) for f in fails] == [(20, "http_500"), (21, "deadline")]
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "config_name: \"default\"" in card
    assert "num_examples: 20" in card and "size_categories:" in card
    assert "TODO(fill in before publishing)" in card
    assert "| stop | 20 |" in card and "| length |" not in card, "attempt 1's cut is gone"
    assert "| 8192 | 1 | 0 | 0.0% |" in card
    assert "| a hedge's winner | 1 |" in card and "| sent again after a missed deadline | 1 |" \
        in card and "| the rest | 18 |" in card
    assert "| HTTP 500 |" not in card and "| http_500 | 1 |" in card
    assert "SGLang: `0.5.6`" in card and "`config.json`: `" + "cd" * 32 in card
    assert "GPU-hours: 3.00 on 2 GPU(s)" in card and "wall time: 1.50 h" in card

    # Again into the same folder: replaced, not refused; a foreign folder is refused.
    again = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(list((out / "data").iterdir())) == 1
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    refused = fleetdeck(fleet, "dataset", "gen-1", "--to", str(foreign), tmp=tmp_path)
    assert refused.returncode == 2 or refused.returncode == 1
    assert "not empty and not a dataset fleetdeck wrote" in refused.stderr
    assert (foreign / "notes.txt").read_text() == "keep"


def test_a_copy_edited_after_the_pull_is_refused_by_name(pulled: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    fleet, copy = pulled
    batch = copy / "completions" / "completions_000001.jsonl"
    batch.write_bytes(batch.read_bytes().replace(b"answer 12", b"answer 99"))
    out = tmp_path / "ds"
    got = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert got.returncode == 1
    assert f"{batch}: " in got.stderr and "changed since it was pulled" in got.stderr
    assert "does not verify, not exported" in got.stderr
    assert not out.exists(), "nothing written"
    # A batch the manifest does not list is refused too.
    batch.write_bytes(batch.read_bytes().replace(b"answer 99", b"answer 12"))
    (copy / "completions" / "completions_000002.jsonl").write_bytes(jsonl([line(22)]))
    got = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert got.returncode == 1
    assert "completions/completions_000002.jsonl: a batch the manifest does not list" \
        in got.stderr


def test_a_run_still_running_or_not_pulled_whole_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "node" / "r1"
    make_run(run_dir, status="running")
    fleet = fleet_file(tmp_path, run_dir)
    assert fleetdeck(fleet, "pull", "gen-1", tmp=tmp_path).returncode == 0
    copy = tmp_path / "pulls" / "gen-1" / "r1"
    (copy / "completions" / "completions_000000.jsonl").unlink()
    got = fleetdeck(fleet, "dataset", "gen-1", "--to", str(tmp_path / "ds"), tmp=tmp_path)
    assert got.returncode == 1
    assert "the run was running when pulled" in got.stderr
    assert "completions/completions_000000.jsonl: not in this copy" in got.stderr
    assert "fleetdeck pull NODE --all" in got.stderr


def hostile(kind: str) -> bytes:
    if kind == "bad-json":
        return b'{"index": 30, "messages": [oops\n'
    return json.dumps(line(22, content="x" * ((64 << 20) + 1))).encode() + b"\n"


@pytest.mark.parametrize("kind, says", [
    ("bad-json", "completions_000002.jsonl:2: malformed"),
    ("huge-field", "completions_000002.jsonl:2: content is 67,108,865 bytes"),
])
def test_a_hostile_batch_line_is_refused_naming_file_and_line(tmp_path: Path, kind: str,
                                                              says: str) -> None:
    """The node wrote it (its manifest hashes it): the copy verifies, the line is refused."""
    run_dir = tmp_path / "node" / "r1"
    make_run(run_dir)
    comp = run_dir / "completions"
    (comp / "completions_000002.jsonl").write_bytes(jsonl([line(23)]) + hostile(kind))
    with open(comp / ".done_indices", "a") as f:
        f.write("23\n22\n")
    fleet = fleet_file(tmp_path, run_dir)
    assert fleetdeck(fleet, "pull", "gen-1", "--all", tmp=tmp_path).returncode == 0
    out = tmp_path / "ds"
    got = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert got.returncode == 1, got.stderr
    assert says in got.stderr
    assert not out.exists() and not list(tmp_path.glob(".ds.fleetdeck-tmp"))


def test_a_campaign_of_two_nodes_exports_its_committed_lines(tmp_path: Path) -> None:
    from tests.trainer.test_campaign_source import RETRIED as C_RETRIED
    from tests.trainer.test_campaign_source import build, committed_answers

    with running_s3() as s3:
        c = build(s3)
        fleet = tmp_path / "fleet.toml"
        fleet.write_text('[[nodes]]\nname = "a"\nlocal = true\nrun_dir = "/x"\n'
                         '[[nodes]]\nname = "b"\nlocal = true\nrun_dir = "/y"\n'
                         '[[campaigns]]\nname = "tq"\nnodes = ["a", "b"]\n')
        out = tmp_path / "ds"
        no_from = fleetdeck(fleet, "dataset", "tq", "--to", str(out), tmp=tmp_path)
        assert no_from.returncode == 2 and "give --from s3://BUCKET/PREFIX" in no_from.stderr
        got = subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "tq", "--to",
                              str(out), "--from", c.url, "--endpoint-url", s3.endpoint_url],
                             capture_output=True, text=True, timeout=600,
                             env={**env(tmp_path), **s3.env()})
        assert got.returncode == 0, got.stderr
    loaded = load_both(out, tmp_path)
    rows = {r["index"]: r for r in loaded["rows"]}
    assert loaded["b"] == len(committed_answers()) == 30
    assert {i: r["content"].split()[0] for i, r in rows.items()} == committed_answers()
    assert all(rows[i]["attempt"] == 2 for i in C_RETRIED)
    card = (out / "README.md").read_text()
    assert "named by no commit (left out): 6" in card and "superseded by a later attempt: 3" \
        in card


class _Recorder:
    """A local stand-in for the Hub's HTTP API (HF_ENDPOINT): it records every request, says
    yes to the repo's creation and the card's check and refuses the rest with 400, so the
    upload stops at its first request (there is no network here)."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.requests: list[tuple[str, str, bytes]] = []
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                rec.requests.append((self.command, self.path, body))
                if self.path.startswith("/api/repos/create"):
                    port = self.server.server_address[1]
                    url = f"http://127.0.0.1:{port}/datasets/me/ds"
                    out, code = json.dumps({"url": url}).encode(), 200
                elif self.path.startswith("/api/validate-yaml"):
                    out, code = b"{}", 200  # the card's header, checked by the Hub itself
                else:
                    out, code = json.dumps({"error": "recorded, refused"}).encode(), 400
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_HEAD = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_push_creates_the_dataset_repo_and_uploads_the_folder(pulled: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    fleet, _ = pulled
    out = tmp_path / "ds"
    hub = _Recorder()
    try:
        got = subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "gen-1", "--to",
                              str(out), "--push", "me/ds"], capture_output=True, text=True,
                             timeout=600, env={**env(tmp_path), "HF_HUB_OFFLINE": "0",
                                               "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test"})
    finally:
        hub.close()
    assert got.returncode == 1, got.stderr
    assert "--push me/ds: the Hub answered" in got.stderr
    seen = [(m, p) for m, p, _ in hub.requests]
    assert ("POST", "/api/repos/create") in seen, seen
    first = seen.index(("POST", "/api/repos/create"))
    asked = json.loads(hub.requests[first][2])
    assert (asked.get("organization"), asked["name"], asked["type"], asked.get("visibility")) == \
        ("me", "ds", "dataset", "private")
    # The next request is the upload of this folder: its files are named in it.
    later = b" ".join(p.encode() + b" " + b for _, p, b in hub.requests[first + 1:])
    assert b"datasets/me/ds" in later
    assert b"README.md" in later and b"train-00000-of-00001.parquet" in later, seen


def push(fleet: Path, out: Path, tmp: Path, hub: _Recorder) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLEETDECK, "--fleet", str(fleet), "dataset", "gen-1", "--to",
                           str(out), "--push", "me/ds"], capture_output=True, text=True,
                          timeout=600, env={**env(tmp), "HF_HUB_OFFLINE": "0",
                                            "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test"})


def test_push_of_an_export_still_as_written_pushes_it_without_exporting_again(
        pulled: tuple[Path, Path], tmp_path: Path) -> None:
    """An interrupted push run again resumes: the folder it uploads is not rewritten (the
    Hub's upload state under .cache/huggingface/ stays); a shard changed since is exported
    again."""
    fleet, _ = pulled
    out = tmp_path / "ds"
    made = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert made.returncode == 0, made.stderr
    (shard,) = (out / "data").iterdir()
    before = shard.stat()
    upload_state = out / ".cache" / "huggingface" / "upload" / "README.md.metadata"
    upload_state.parent.mkdir(parents=True)
    upload_state.write_text("the Hub's own: a push's progress")
    hub = _Recorder()
    try:
        again = push(fleet, out, tmp_path, hub)
        pushed_first = [(m, p) for m, p, _ in hub.requests]
        kept = upload_state.is_file() and shard.stat().st_ino == before.st_ino
        shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
        changed = push(fleet, out, tmp_path, hub)
    finally:
        hub.close()
    assert again.returncode == 1, again.stderr  # the stand-in refuses the upload itself
    assert "pushed as it is, not exported again" in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[0])["reused"] is True
    assert ("POST", "/api/repos/create") in pushed_first, "the push went ahead"
    # (the export's own mark, with local paths, is never uploaded)
    assert b".fleetdeck-dataset.json" not in b" ".join(b for _, _, b in hub.requests)
    assert kept, "the folder as it was (the shard, the upload's state) for the resume"
    assert "changed since it was exported" in changed.stderr
    assert "exporting again" in changed.stderr and "pushed as it is" not in changed.stderr
    (new,) = (out / "data").iterdir()
    assert new.read_bytes().endswith(b"PAR1"), "the changed shard replaced by a fresh export"
    assert not upload_state.exists(), "a fresh export starts a fresh upload"


def uploaded_sample(hub: _Recorder, name: str) -> bytes:
    """The start of file `name` as the upload sent it (the Hub's preupload request carries
    each file's first bytes, base64)."""
    import base64

    for _, path, body in hub.requests:
        if "preupload" not in path:
            continue
        for f in json.loads(body).get("files", []):
            if f.get("path") == name:
                return base64.b64decode(f["sample"])
    raise AssertionError(f"{name} not in any upload request: {[p for _, p, _ in hub.requests]}")


def test_the_card_filled_in_and_a_license_added_are_pushed_as_they_are(
        pulled: tuple[Path, Path], tmp_path: Path) -> None:
    """The README's workflow: export, fill in the card's TODOs, add a LICENSE, push. The data
    is unchanged, so the folder goes up as the user left it; an export into it (the data
    changed, or asked without --push) refuses, naming the user's files, unless --force."""
    fleet, _ = pulled
    out = tmp_path / "ds"
    made = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert made.returncode == 0, made.stderr
    card = out / "README.md"
    assert 'license: "other"' in card.read_text()
    edited = card.read_text().replace('license: "other"', 'license: "cc-by-4.0"') \
        .replace("TODO(fill in before publishing)", "Questions answered by a tiny model")
    card.write_text(edited)
    (out / "LICENSE").write_text("CC BY 4.0, the user's own file\n")
    hub = _Recorder()
    try:
        pushed = push(fleet, out, tmp_path, hub)
    finally:
        hub.close()
    assert "pushed as it is, not exported again" in pushed.stderr, pushed.stderr
    assert card.read_text() == edited and (out / "LICENSE").is_file()
    assert b'license: "cc-by-4.0"' in uploaded_sample(hub, "README.md")
    assert uploaded_sample(hub, "LICENSE") == b"CC BY 4.0, the user's own file\n"

    # A fresh export would replace them: refused, naming them, and nothing touched.
    again = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), tmp=tmp_path)
    assert again.returncode == 1
    assert f"{out}: holds what a new export would replace: LICENSE, README.md" in again.stderr
    assert "--force" in again.stderr
    assert card.read_text() == edited and (out / "LICENSE").is_file()
    forced = fleetdeck(fleet, "dataset", "gen-1", "--to", str(out), "--force", tmp=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "--force: removed LICENSE, README.md (yours)" in forced.stderr
    assert 'license: "other"' in card.read_text() and not (out / "LICENSE").exists()
