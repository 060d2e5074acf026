"""Record goldens from a real SGLang server: what it answers, exposes and logs, as it said it.

    .venv/bin/python scripts/record_sglang_goldens.py          # start servers, record all
    .venv/bin/python scripts/record_sglang_goldens.py --url URL --log PATH --out DIR [--profile P]

Without --url it starts the real-server tier's SGLang (tests/real/server.py `start_server`)
itself, once per profile, polling /health from the launch on: `default` (KV pool 65,536),
`small-kv` (3,072: it queues and retracts) and `overload` (--max-running-requests 2
--max-queued-requests 2: the only way a real server refuses for a full queue); the goldens go
to tests/fixtures/sglang/real-<version>/ (its manifest.json says what each file is). With
--url it records one profile against a running server whose log is PATH (no start-up health
then). Exit 1, naming what is missing, when a profile could not record something it must.

Values are kept as recorded (ids, timestamps, latencies, ports, paths): the tests compare
shapes, key sets and types. What a profile records:

- default: bodies/ (chat completions with the engine's request body, finish stop and length;
  /generate likewise, and without max_new_tokens; both streamed; /v1/completions; a running
  chat and a running /generate aborted by rid, their answers and the abort's; an unknown rid's
  abort; /health, /v1/models, /model_info, /v1/loads), errors/ (context too long on both routes, a
  body without messages, an unknown route), server_info/ (/server_info, /get_server_info),
  metrics/ (idle, and busy while 4 requests run), startup/ (the log to "fired up"), decode/
  and prefill/ (the batch lines logged while recording).
- small-kv: 16 /generate requests at once (256 tokens, a quarter of them 32): queueing, the
  retraction line ("KV cache pool is full. Retract requests."), /metrics while queued and
  after, /health while queued, an answer with num_retractions >= 1.
- overload: 6 requests at once on a server that runs 2 and queues 2: the refusals' bodies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents.engine.client import build_request  # noqa: E402
from agents.engine.prompts import Prompt  # noqa: E402
from tests.real.env import SGLANG_VERSION  # noqa: E402
from tests.real.server import Metrics  # noqa: E402

READY = "The server is fired up and ready to roll!"
RETRACT = "KV cache pool is full. Retract requests."
PROFILES = ("default", "small-kv", "overload")
SERVER_FLAGS = {"default": ((), 65536), "small-kv": ((), 3072),
                "overload": (("--max-running-requests", "2", "--max-queued-requests", "2"),
                             65536)}
# What the engine's spec would send ([sampling], [generate] chat_template_kwargs).
SAMPLING = {"temperature": 0.7, "top_p": 0.95}
TEMPLATE_KWARGS = {"enable_thinking": False}
# Every token of the tiny model's vocabulary but its specials: the answer stops at its first
# token, as at an end-of-sequence token (matched_stop: the token id).
STOP_IDS = list(range(5, 2048))


class MissingGolden(RuntimeError):
    """A profile did not record something the committed goldens hold."""


class Recorder:
    """Writes one server's goldens under `out`, and the manifest entries that describe them."""

    def __init__(self, out: Path, url: str, log: Path, profile: str) -> None:
        self.out, self.url, self.log, self.profile = out, url, log, profile
        self.name = profile  # the server's name in file names and the manifest
        self.http = httpx.Client(base_url=url, timeout=httpx.Timeout(300, connect=10))
        self.files: dict[str, dict[str, Any]] = {}
        self.log_start = log.stat().st_size if log.exists() else 0
        self.began = time.monotonic()
        self.aborted = 0  # requests it aborted (the server counts them too)

    def note(self, rel: str, kind: str, what: str) -> Path:
        self.files[rel] = {"profile": self.profile, "server": self.name, "kind": kind,
                           "what": what}
        print(f"{time.monotonic() - self.began:7.1f} s  {self.profile}: {rel}",
              file=sys.stderr, flush=True)
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def write_json(self, rel: str, kind: str, what: str, obj: Any) -> None:
        self.note(rel, kind, what).write_text(json.dumps(obj, indent=1, ensure_ascii=False)
                                              + "\n")

    def write_text(self, rel: str, kind: str, what: str, text: str) -> None:
        self.note(rel, kind, what).write_text(text)

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One exchange as recorded: the request, the status, the content type and the body
        (parsed when it is JSON, else its text)."""
        r = self.http.request(method, path, json=body)
        return exchange(method, path, body, r)

    def record(self, rel: str, what: str, method: str, path: str,
               body: Any = None) -> dict[str, Any]:
        ex = self.call(method, path, body)
        self.write_json(rel, "exchange", what, ex)
        return ex

    def metrics(self) -> Metrics:
        return Metrics.parse(self.http.get("/metrics").text)

    def wait_metrics(self, ok: Callable[[Metrics], bool], what: str,
                     timeout: float = 120) -> Metrics:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if ok(m):
                return m
            if time.monotonic() > deadline:
                raise MissingGolden(f"{self.name}: {what} not seen in {timeout:.0f} s")
            time.sleep(0.1)

    def count_lines(self, needle: str) -> int:
        return sum(needle in line for line in self.log_window())

    def wait_lines(self, needle: str, before: int, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.count_lines(needle) <= before:
            if time.monotonic() > deadline:
                raise MissingGolden(f"{self.name}: {what} not logged in {timeout:.0f} s")
            time.sleep(0.05)

    def log_window(self) -> list[str]:
        """The log's lines written since this recorder began."""
        with open(self.log, "rb") as f:
            f.seek(self.log_start)
            return f.read().decode(errors="replace").splitlines()


def exchange(method: str, path: str, body: Any, r: httpx.Response) -> dict[str, Any]:
    out: dict[str, Any] = {"request": {"method": method, "path": path, "body": body},
                           "status": r.status_code,
                           "content_type": r.headers.get("content-type")}
    try:
        out["body"] = r.json()
    except ValueError:
        out["text"] = r.text
    return out


def chat_body(text: str, max_tokens: int, rid: str | None = None,
              **sampling: Any) -> dict[str, Any]:
    """The engine's own request body (agents/engine/client.py `build_request`)."""
    prompt = Prompt(index=0, id=None, messages=[{"role": "user", "content": text}], tools=None)
    return build_request(prompt, "tiny", max_tokens, {**SAMPLING, **sampling},
                         TEMPLATE_KWARGS, rid=rid)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    t.start()
    return t, box


# ----- the profiles ----------------------------------------------------------------------

def record_default(rec: Recorder) -> None:
    info = rec.http.get("/server_info").json()
    context = int(info["context_length"] or 4096)
    rec.write_json("server_info/server_info.json", "server_info", "GET /server_info, idle",
                   info)
    rec.record("server_info/get_server_info.json", "GET /get_server_info (deprecated alias)",
               "GET", "/get_server_info")
    rec.write_text("metrics/idle.txt", "metrics", "GET /metrics, idle",
                   rec.http.get("/metrics").text)
    rec.record("bodies/health.json", "GET /health, idle", "GET", "/health")

    for _ in range(5):  # a first token among the special ones does not stop: again
        ex = rec.record("bodies/chat_stop.json", "chat, the engine's body: finish stop "
                        "(stop_token_ids: every non-special token)", "POST",
                        "/v1/chat/completions",
                        chat_body("Say one word.", 64, rid="golden-chat-stop",
                                  stop_token_ids=STOP_IDS))
        if ex["body"]["choices"][0]["finish_reason"] == "stop":
            break
    rec.record("bodies/chat_length.json", "chat, the engine's body: finish length",
               "POST", "/v1/chat/completions",
               chat_body("Tell me a story.", 8, rid="golden-chat-length", ignore_eos=True))
    rec.record("bodies/generate_stop.json", "/generate: finish stop", "POST", "/generate",
               {"text": "Say one word.", "rid": "golden-generate-stop",
                "sampling_params": {"max_new_tokens": 64, "stop_token_ids": STOP_IDS}})
    rec.record("bodies/generate_length.json", "/generate: finish length", "POST", "/generate",
               {"text": "Tell me a story.", "rid": "golden-generate-length",
                "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    rec.record("bodies/generate_default_length.json", "/generate without max_new_tokens "
               "(ignore_eos): its default length", "POST", "/generate",
               {"text": "Tell me a story.", "sampling_params": {"ignore_eos": True}})
    rec.record("bodies/chat_stream.json", "chat, the engine's body streamed, with usage: the "
               "SSE text", "POST", "/v1/chat/completions",
               {**chat_body("Tell me a story.", 8, ignore_eos=True), "stream": True,
                "stream_options": {"include_usage": True}})
    rec.record("bodies/generate_stream.json", "/generate streamed: the SSE text", "POST",
               "/generate", {"text": "Tell me a story.", "stream": True,
                             "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
    rec.record("bodies/completion_length.json", "/v1/completions: finish length", "POST",
               "/v1/completions", {"model": "tiny", "prompt": "Once upon", "max_tokens": 8,
                                   "ignore_eos": True})
    for path in ("/v1/models", "/model_info", "/v1/loads", "/v1/loads?include=core"):
        rec.record(f"bodies/get_{re.sub(r'[^a-z0-9]+', '_', path.strip('/'))}.json",
                   f"GET {path}", "GET", path)

    for route, name, body in (
            ("/v1/chat/completions", "chat",
             chat_body("Go on forever.", context - 64, rid="golden-abort-chat",
                       ignore_eos=True)),
            ("/generate", "generate",
             {"text": "Go on forever.", "rid": "golden-abort-generate",
              "sampling_params": {"max_new_tokens": context - 64, "ignore_eos": True}})):
        # Running once its prefill is logged (the gauges lag: they refresh every 40 steps).
        prefills = rec.count_lines("Prefill batch")
        t, box = in_thread(lambda route=route, body=body: rec.call("POST", route, body))
        rec.wait_lines("Prefill batch", prefills, f"the {name} request's prefill")
        rec.record(f"bodies/abort_{name}.json", f"POST /abort_request of a running {name} "
                   "request", "POST", "/abort_request", {"rid": body["rid"]})
        t.join(120)
        rec.write_json(f"bodies/{name}_aborted.json", "exchange",
                       f"the aborted {name} request's own answer", box["result"])
    rec.record("bodies/abort_unknown_rid.json", "POST /abort_request of a rid it never had",
               "POST", "/abort_request", {"rid": "golden-never-sent"})

    rec.record("errors/chat_context_too_long.json", "chat: prompt + max_tokens over the "
               "context length", "POST", "/v1/chat/completions",
               chat_body("Too long.", context + 1, rid="golden-too-long"))
    rec.record("errors/generate_context_too_long.json", "/generate: prompt + max_new_tokens "
               "over the context length", "POST", "/generate",
               {"text": "Too long.", "sampling_params": {"max_new_tokens": context + 1}})
    rec.record("errors/chat_no_messages.json", "chat: a body without messages", "POST",
               "/v1/chat/completions", {"model": "tiny", "max_tokens": 4})
    rec.record("errors/unknown_route.json", "GET of a route the server does not have", "GET",
               "/no_such_route")

    # Busy: the running gauge refreshes at the decode line of step 40; then they are cut
    # short, which is quicker than their end on a loaded machine.
    rids = [f"golden-busy-{i}" for i in range(4)]
    threads = [in_thread(lambda rid=rid: rec.call("POST", "/v1/chat/completions", chat_body(
        f"Busy story {rid}.", 400, rid=rid, ignore_eos=True)))[0] for rid in rids]
    rec.wait_metrics(lambda m: m["num_running_reqs"] >= 2, "2 requests running")
    rec.write_text("metrics/busy.txt", "metrics", "GET /metrics while 4 chat requests run",
                   rec.http.get("/metrics").text)
    for rid in rids:
        rec.http.post("/abort_request", json={"rid": rid})
    for t in threads:
        t.join(300)
    rec.aborted += 2 + len(rids)
    write_log_lines(rec)


def record_small_kv(rec: Recorder) -> None:
    rec.write_json(f"server_info/{rec.name}.json", "server_info",
                   "GET /server_info of the small-KV server", rec.http.get("/server_info").json())
    for attempt in range(4):  # the retraction needs early finishers: random endings
        results: dict[int, dict[str, Any]] = {}
        queued_text: str | None = None
        health: list[int] = []
        threads = []
        for i in range(16):
            body = {"text": f"Story {attempt}-{i}: once upon a time",
                    "rid": f"golden-kv-{attempt}-{i}",
                    "sampling_params": {"max_new_tokens": 32 if i % 4 == 0 else 256}}
            t, box = in_thread(lambda body=body: rec.call("POST", "/generate", body))
            threads.append((i, t, box))
        next_health = 0.0
        while any(t.is_alive() for _, t, _ in threads):
            m = rec.metrics()
            if queued_text is None and m["num_queue_reqs"] > 0:
                queued_text = m.text
            if time.monotonic() > next_health:
                health.append(rec.http.get("/health").status_code)
                next_health = time.monotonic() + 1.0
            time.sleep(0.2)
        for i, t, box in threads:
            t.join()
            results[i] = box["result"]
        retracted = [ex for ex in results.values()
                     if ex["body"]["meta_info"].get("num_retractions", 0) > 0]
        if retracted and queued_text is not None:
            break
    else:
        raise MissingGolden(f"{rec.name}: no retraction in 4 bursts of 16 requests")
    rec.write_text(f"metrics/{rec.name}_queued.txt", "metrics",
                   "GET /metrics while requests wait in the queue", queued_text)
    rec.write_text(f"metrics/{rec.name}_after.txt", "metrics",
                   "GET /metrics after the burst (retraction counters)",
                   rec.http.get("/metrics").text)
    rec.write_json(f"bodies/{rec.name}_health_while_queued.json", "health_codes",
                   "GET /health status codes, one a second, while the burst ran",
                   {"codes": health})
    rec.write_json("bodies/generate_retracted.json", "exchange",
                   "/generate answer of a request that was retracted", retracted[0])
    write_log_lines(rec)
    if not any(RETRACT in line for line in rec.log_window()):
        raise MissingGolden(f"{rec.name}: no {RETRACT!r} line in {rec.log}")


def record_overload(rec: Recorder) -> None:
    threads = [(i, *in_thread(lambda i=i: rec.call(
        "POST", "/v1/chat/completions" if i % 2 else "/generate",
        chat_body(f"Overload {i}.", 400, ignore_eos=True) if i % 2 else
        {"text": f"Overload {i}.", "sampling_params": {"max_new_tokens": 400,
                                                       "ignore_eos": True}})))
               for i in range(8)]
    results = []
    for _, t, box in threads:
        t.join(300)
        results.append(box["result"])
    refused = {ex["request"]["path"]: ex for ex in results if ex["status"] != 200}
    for path, ex in sorted(refused.items()):
        name = "chat" if "chat" in path else "generate"
        rec.write_json(f"errors/{name}_queue_full.json", "exchange",
                       f"{path} refused: --max-queued-requests 2 full", ex)
    rec.write_json("bodies/overload_statuses.json", "statuses",
                   "statuses of 8 requests at once on a server running 2, queueing 2",
                   {"statuses": [ex["status"] for ex in results]})
    if len(refused) < 2:
        raise MissingGolden(f"{rec.name}: not both routes refused (statuses "
                            f"{[ex['status'] for ex in results]})")


def write_log_lines(rec: Recorder) -> None:
    lines = rec.log_window()
    for folder, needle in (("decode", "Decode batch"), ("prefill", "Prefill batch")):
        found = [line for line in lines if needle in line]
        if not found:
            raise MissingGolden(f"{rec.name}: no {needle!r} line in {rec.log}")
        rec.write_text(f"{folder}/{rec.name}.log", "log", f"the {needle} lines logged while "
                       "recording, verbatim, other lines left out", "\n".join(found) + "\n")
    retract = [line for line in lines if RETRACT in line]
    if retract:
        rec.write_text(f"decode/{rec.name}_retract.log", "log", "the retraction lines logged "
                       "while recording, verbatim", "\n".join(retract) + "\n")


def write_startup(rec: Recorder) -> None:
    text = rec.log.read_text(errors="replace")
    end = text.find(READY)
    if end < 0:
        raise MissingGolden(f"{rec.name}: no {READY!r} in {rec.log}")
    end = text.index("\n", end) + 1
    rec.write_text(f"startup/{rec.name}.log", "startup", "the log from the launch to "
                   '"fired up", verbatim', text[:end])


# ----- starting servers ------------------------------------------------------------------

def watch_health(url: str, stop: threading.Event, out: dict[str, Any]) -> None:
    """Poll /health from the launch until 200: runs of the same answer, and the first 503's
    own response."""
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    while not stop.is_set():
        try:
            r = httpx.get(f"{url}/health", timeout=5)
            code: int | str = r.status_code
            if code == 503 and "first_503" not in out:
                out["first_503"] = exchange("GET", "/health", None, r)
        except httpx.ConnectError:
            code = "refused"
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        at = round(time.monotonic() - t0, 2)
        if runs and runs[-1]["answer"] == code:
            runs[-1].update(count=runs[-1]["count"] + 1, last_s=at)
        else:
            runs.append({"answer": code, "count": 1, "first_s": at, "last_s": at})
        if code == 200:
            break
        time.sleep(0.05)
    out["runs"] = runs


def start_and_record(out: Path, profile: str, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from tests.real.env import build
    from tests.real.server import start_server

    extra, kv = SERVER_FLAGS[profile]
    (work / profile / "sglang.log").unlink(missing_ok=True)  # start_server appends
    server = start_server(build(), work / profile, *extra, max_total_tokens=kv)
    health: dict[str, Any] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_health, args=(server.url, stop, health))
    watcher.start()
    try:
        ready = server.wait_ready()
        watcher.join(30)
        rec = Recorder(out, server.url, server.log_path, profile)
        write_startup(rec)
        rec.write_json(f"startup/{profile}_health.json", "health_runs", "GET /health from the "
                       "launch, every 50 ms, until 200: runs of one answer", health.get("runs"))
        if "first_503" in health:
            rec.write_json(f"errors/{profile}_health_loading.json", "exchange",
                           "GET /health answered 503 while starting", health["first_503"])
        PROFILE_FUNCS[profile](rec)
        info = rec.http.get("/server_info").json()
        return rec.files, {"launch_command": info.get("launch_command"),
                           "version": info.get("version"), "ready_after_s": round(ready, 1),
                           "started_by_recorder": True, "recorded_at": now(),
                           "aborted": rec.aborted}
    finally:
        stop.set()
        server.kill()


PROFILE_FUNCS: dict[str, Callable[[Recorder], None]] = {
    "default": record_default, "small-kv": record_small_kv, "overload": record_overload}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_manifest(out: Path, files: dict[str, dict[str, Any]],
                   servers: dict[str, dict[str, Any]]) -> None:
    path = out / "manifest.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    versions = {s["version"] for s in servers.values()}
    manifest = {
        "sglang_version": versions.pop() if len(versions) == 1 else sorted(versions),
        "recorded_at": now(),
        "recorder": "scripts/record_sglang_goldens.py",
        "servers": {**old.get("servers", {}), **servers},
        "files": {**old.get("files", {}), **files},
    }
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (with --log); else start servers here")
    p.add_argument("--log", type=Path, help="that server's log file")
    p.add_argument("--out", type=Path, help="where the goldens go "
                   "(default: tests/fixtures/sglang/real-<version>/)")
    p.add_argument("--profile", choices=PROFILES, action="append",
                   help="what to record (repeatable; default: default, or all three when "
                   "starting servers)")
    p.add_argument("--work", type=Path, default=Path("/tmp/fleetdeck-record-sglang"),
                   help="folder for the servers this script starts (their logs)")
    args = p.parse_args(argv)
    if (args.url is None) != (args.log is None):
        p.error("--url and --log go together")
    try:
        if args.url:
            profiles = args.profile or ["default"]
            version = httpx.get(f"{args.url}/server_info", timeout=30).json()["version"]
            out = args.out or REPO / "tests" / "fixtures" / "sglang" / f"real-{version}"
            files: dict[str, dict[str, Any]] = {}
            aborted = 0
            for profile in profiles:
                rec = Recorder(out, args.url, args.log, profile)
                if profile == "default":
                    write_startup(rec)
                PROFILE_FUNCS[profile](rec)
                files.update(rec.files)
                aborted += rec.aborted
            servers = {profile: {"version": version, "url": args.url,
                                 "started_by_recorder": False, "recorded_at": now()}
                       for profile in profiles}
        else:
            profiles = args.profile or list(PROFILES)
            out = args.out or REPO / "tests" / "fixtures" / "sglang" / f"real-{SGLANG_VERSION}"
            files, servers, aborted = {}, {}, 0
            for profile in profiles:
                got, server = start_and_record(out, profile, args.work)
                files.update(got)
                servers[profile] = server
                aborted += server["aborted"]
        write_manifest(out, files, servers)
    except MissingGolden as exc:
        print(f"record_sglang_goldens: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(out), "files": len(files), "aborted": aborted}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
