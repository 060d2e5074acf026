"""provenance.json captured live by the real supervisor (agents/supervise/provenance.py's
`capture_live`), on simulated SGLang servers, with S3 on the real SeaweedFS: the file appears in
the run dir and in S3 under the run's prefix beside its batches, names the sha256 of the model
folder's files, holds the server args its /server_info gives (live state left out), and no
secret value of the run anywhere (planted as tests/agent/test_secrets.py plants them: the key
is also on the server's command line, which /server_info echoes). A run whose servers are only
`urls` (started elsewhere) records it too, once their /server_info answers."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.supervise.provenance import LIVE_KEYS, REDACTED
from tests.agent.test_secrets import SECRETS, _with_secrets
from tests.engine.runs import write_prompts, write_spec
from tests.plugins.supervised import agent, kill_run
from tests.servers.ports import kill_pid, wait_until
from tests.servers.s3 import S3Server
from tests.simserver import start_sim

PREFIX = "runs/prov/"


def model_folder(root: Path) -> tuple[Path, dict[str, str]]:
    """A model folder as the Hub lays one out: what it means (hashed) beside its weights."""
    folder = root / "model"
    folder.mkdir()
    files = {"config.json": b'{"architectures": ["Qwen3ForCausalLM"]}',
             "tokenizer.json": b'{"model": {"type": "BPE"}}',
             "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}'}
    for name, body in files.items():
        (folder / name).write_bytes(body)
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)  # weights: never hashed
    return folder, {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}


def with_s3(spec: Path, s3: S3Server) -> None:
    spec.write_text(spec.read_text() + f'\n[s3]\nbucket = "{s3.bucket}"\nprefix = "{PREFIX}"\n'
                    f'endpoint_url = "{s3.endpoint_url}"\nregion = "us-east-1"\n')


def s3_keys(s3: S3Server) -> list[str]:
    got = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=PREFIX)
    return [o["Key"] for o in got.get("Contents", [])]


def s3_body(s3: S3Server, key: str) -> bytes:
    body: bytes = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    return body


def server_info(url: str, key: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(trust_env=False, timeout=30) as client:
        for path in ("/server_info", "/get_server_info"):
            resp = client.get(f"{url}{path}", headers=headers)
            if resp.status_code == 200:
                body: dict[str, Any] = resp.json()
                return body
    raise AssertionError(f"{url}: no server info")


def wait_for_provenance(run_dir: Path, s3: S3Server) -> tuple[dict[str, Any], bytes]:
    key = f"{PREFIX}journals/run/provenance.json"
    path = run_dir / "provenance.json"
    wait_until(lambda: path.is_file() and key in s3_keys(s3), 180,
               "provenance.json in the run dir and in S3")
    # In S3 as written here (the put follows the local write; a later capture, none here).
    wait_until(lambda: s3_body(s3, key) == path.read_bytes(), 60, "the same bytes in S3")
    return json.loads(path.read_bytes()), s3_body(s3, key)


def no_secret(*texts: bytes) -> None:
    leaked = [k for k, v in SECRETS.items() for t in texts if v.encode() in t]
    assert leaked == [], f"a secret in provenance.json: {leaked}"


@pytest.mark.timeout(600)
def test_the_supervisor_records_provenance_when_its_first_server_is_ready(
        supervised: Any, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3.env().items():  # the supervisor's S3 credentials: boto3's chain
        monkeypatch.setenv(k, v)
    model, hashes = model_folder(tmp_path)
    run = supervised(1, prompts=150)
    run.spec.write_text(run.spec.read_text().replace('model = "qwen-sim"',
                                                     f'model = "{model}"'))
    _with_secrets(run.spec)
    with_s3(run.spec, s3)
    r = agent("up", str(run.spec))
    assert r.returncode == 0, r.stderr
    doc, in_s3 = wait_for_provenance(run.run_dir, s3)
    (cap,) = doc["captures"]
    assert cap["model_dir"] == str(model) and cap["model_files"] == hashes
    info = server_info(f"http://127.0.0.1:{run.servers()[0]['port']}", SECRETS["api_key"])
    assert cap["sglang_version"] == info["version"]
    args = cap["server_args"]
    assert not LIVE_KEYS & set(args) and "version" not in args
    assert args["model_path"] == str(model) and args["port"] == info["port"]
    assert args["tp_size"] == info["tp_size"]
    assert {k for k in info if k not in LIVE_KEYS | {"version"}} == set(args)
    # The server echoes its command line, key and all: cut out, the rest as it was.
    assert SECRETS["api_key"] in info["launch_command"]
    assert args["launch_command"] == info["launch_command"].replace(SECRETS["api_key"],
                                                                    REDACTED)
    assert "--api-key" in (cap["launch_command"] or ""), "the launch script, as launched"
    no_secret(in_s3, (run.run_dir / "provenance.json").read_bytes())
    # Beside the batches: the run's batches reach the same prefix.
    wait_until(lambda: any("completions_" in k for k in s3_keys(s3)), 180, "a batch in S3")
    agent("down", str(run.run_dir), "--yes")


@pytest.mark.timeout(600)
def test_a_run_on_servers_started_elsewhere_records_it_once_they_answer(
        s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    model, hashes = model_folder(tmp_path)
    (tmp_path / "sim").mkdir()
    sim = start_sim(tmp_path / "sim", "--time-scale", "0.05", "--load-seconds", "0",
                    "--model-path", str(model))
    try:
        prompts = tmp_path / "prompts.jsonl"
        write_prompts(prompts, 60)
        spec = write_spec(tmp_path / "run.toml", prompts, [sim.url])
        with_s3(spec, s3)
        run_dir = tmp_path / "run"
        try:
            r = agent("up", str(spec))
            assert r.returncode == 0, r.stderr
            doc, _ = wait_for_provenance(run_dir, s3)
            (cap,) = doc["captures"]
            assert cap["model_files"] == hashes and cap["launch_command"] is None
            assert cap["server_args"]["model_path"] == str(model)
            assert cap["sglang_version"] == server_info(sim.url, None)["version"]
        finally:
            agent("down", str(run_dir), "--yes")
            kill_run(run_dir)
    finally:
        kill_pid(sim.proc)
    assert os.path.exists(run_dir / "provenance.json")


class _FlakyInfo:
    """In front of a simulator, a forwarding HTTP server whose server-info endpoints fail
    (503) for a stretch of asks after the first: the URL watch sees the server answer, then
    the supervisor's capture meets the 503s, as a server still loading or overloaded gives."""

    def __init__(self, upstream: str, failing: range) -> None:
        import http.server
        import threading

        self.answers: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                path = self.path.split("?")[0]
                code: int | None = None
                if path in ("/server_info", "/get_server_info"):
                    with flaky.lock:
                        asked = sum(1 for p, _ in flaky.answers if p == "info") + 1
                        code = 503 if asked in failing else None
                        flaky.answers.append(("info", code or 200))
                if code is not None:
                    out, ctype = b'{"error": "not now"}', "application/json"
                else:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() in ("content-type", "authorization")}
                    with httpx.Client(trust_env=False, timeout=60) as client:
                        resp = client.request(self.command, upstream + self.path,
                                              content=body, headers=headers)
                    code, out = resp.status_code, resp.content
                    ctype = resp.headers.get("content-type", "application/json")
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def failed(self) -> int:
        with self.lock:
            return sum(1 for _, code in self.answers if code == 503)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.timeout(600)
def test_a_capture_that_finds_no_server_info_is_tried_again_until_it_answers(
        tmp_path: Path) -> None:
    """No capture without the server's args: the failed tries record nothing, a later try
    (backing off) records the whole capture."""
    model, hashes = model_folder(tmp_path)
    (tmp_path / "sim").mkdir()
    sim = start_sim(tmp_path / "sim", "--time-scale", "0.05", "--load-seconds", "0",
                    "--model-path", str(model))
    flaky = _FlakyInfo(sim.url, range(2, 8))
    run_dir = tmp_path / "run"
    try:
        prompts = tmp_path / "prompts.jsonl"
        write_prompts(prompts, 60)
        spec = write_spec(tmp_path / "run.toml", prompts, [flaky.url])
        try:
            r = agent("up", str(spec))
            assert r.returncode == 0, r.stderr
            path = run_dir / "provenance.json"
            wait_until(path.is_file, 180, "provenance.json in the run dir")
            assert flaky.failed() == 6, "every failing ask was asked before the capture"
            doc = json.loads(path.read_bytes())
            (cap,) = doc["captures"]
            assert cap["server_args"]["model_path"] == str(model)
            assert cap["model_files"] == hashes
            assert cap["sglang_version"] == server_info(sim.url, None)["version"]
        finally:
            agent("down", str(run_dir), "--yes")
            kill_run(run_dir)
    finally:
        flaky.close()
        kill_pid(sim.proc)
