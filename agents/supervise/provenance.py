"""How a run's lines were made, captured while the GPU node is still there: when the first
server is ready, `provenance.json` in the run directory (and beside the journals in S3) holds
the sha256 of the model's config, tokenizer and chat-template files, SGLang's version and
server args as `/server_info` gives them, the launch command, sampling, chat template kwargs
and the reasoning parser. Secrets never reach it (agents/rundir/secrets.py's rules, and every
secret value of the spec scrubbed from every string). A new capture that differs from the
last (a resume on another machine, another SGLang) is appended, never written over.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from agents.rundir.atomic import atomic_write
from agents.rundir.secrets import is_secret_env
from agents.rundir.spec import RunSpec

PROVENANCE_FILE = "provenance.json"
VERSION = 1
REDACTED = "<redacted>"
# The model's files that say what its tokens mean (weights are hashed by nobody: GBs).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
               "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
               "chat_template.json")
# /server_info's live state, not how the server was set up.
LIVE_KEYS = frozenset({"internal_states", "last_gen_throughput", "avg_spec_accept_length",
                       "max_total_num_tokens", "max_req_input_len"})
# SGLang's server arguments whose value is a secret (its ServerArgs: the keys a client must
# send, the TLS key's password), and the Hub token some launchers pass along. Named exactly:
# a substring rule would also hit max_total_tokens, tokenizer_path, speculative_num_draft_tokens.
SECRET_ARGS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password", "hf_token"})
# A capture differs from the last by these, never by its time.
SAME = ("model_files", "sglang_version", "server_args", "launch_command", "sampling",
        "chat_template_kwargs", "reasoning_parser", "model")


class Capture(msgspec.Struct, omit_defaults=False):
    captured_at: float
    model: str
    model_dir: str | None
    model_files: dict[str, str]  # name -> sha256
    model_files_note: str | None
    sglang_version: str | None
    server_args: dict[str, Any]
    launch_command: str | None
    sampling: dict[str, Any]
    chat_template_kwargs: dict[str, Any]
    reasoning_parser: str | None
    max_tokens: int


class Provenance(msgspec.Struct):
    v: int
    captures: list[Capture]

    @property
    def last(self) -> Capture:
        return self.captures[-1]


provenance_decoder = msgspec.json.Decoder(Provenance)


def secret_values(spec: RunSpec) -> list[str]:
    """Every secret string of the spec: scrubbed wherever it shows up."""
    s = spec.servers
    values = [s.api_key, s.admin_api_key]
    values += [v for k, v in s.env.items() if is_secret_env(k, s.secret_env)]
    values.append(spec.alerts.webhook)
    return [v for v in values if isinstance(v, str) and len(v) >= 4]


class ProvenanceError(RuntimeError):
    """No capture: the server did not say how it was set up."""


def scrub(value: Any, secrets: Iterable[str], key: str = "") -> Any:
    """`value` with every secret argument (SECRET_ARGS, by exact name) redacted and every
    secret value of the run cut out."""
    secrets = list(secrets)
    if key in SECRET_ARGS and value not in (None, "", []):
        return REDACTED
    if isinstance(value, dict):
        return {str(k): scrub(v, secrets, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, str):
        for s in secrets:
            value = value.replace(s, REDACTED)
        return value
    return value


def model_dir_of(model: str, server_args: dict[str, Any]) -> tuple[Path | None, str | None]:
    """The folder the server loaded the model from: its `model_path` or the spec's model when
    either is a local folder, else the Hugging Face cache's one snapshot of that repo."""
    for name in (server_args.get("model_path"), server_args.get("tokenizer_path"), model):
        if isinstance(name, str) and name and Path(name).is_dir():
            return Path(name), None
    repo = server_args.get("model_path") if isinstance(server_args.get("model_path"), str) \
        else model
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(
        os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub")
    snaps = hub / f"models--{str(repo).replace('/', '--')}" / "snapshots"
    found = sorted(p for p in snaps.iterdir() if p.is_dir()) if snaps.is_dir() else []
    if len(found) == 1:
        return found[0], None
    why = (f"{len(found)} snapshots of {repo} in {snaps}: which one was served is not known"
           if found else f"{repo!r} is not a local folder and not in the Hugging Face cache "
           f"({hub})")
    return None, why


def hash_model_files(folder: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in MODEL_FILES:
        path = folder / name
        if not path.is_file():
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        out[name] = digest.hexdigest()
    return out


def capture(spec: RunSpec, server_info: dict[str, Any], launch_command: str | None,
            now: float | None = None) -> Capture:
    """One capture from a ready server's `/server_info` body and its launch script (blocking:
    it hashes files)."""
    secrets = secret_values(spec)
    args = {k: v for k, v in server_info.items() if k not in LIVE_KEYS and k != "version"}
    args = scrub(args, secrets)
    version = server_info.get("version")
    gen = spec.generate
    folder, note = model_dir_of(spec.model_name, args)
    files = hash_model_files(folder) if folder is not None else {}
    if folder is not None and not files:
        note = f"{folder} holds none of {', '.join(MODEL_FILES)}"
    parser = args.get("reasoning_parser")
    return Capture(
        captured_at=time.time() if now is None else now, model=spec.model_name,
        model_dir=str(folder) if folder is not None else None, model_files=files,
        model_files_note=note, sglang_version=str(version) if version is not None else None,
        server_args=args,
        launch_command=scrub(launch_command, secrets) if launch_command else None,
        sampling=scrub(dict(gen.sampling), secrets) if gen else {},
        chat_template_kwargs=scrub(dict(gen.chat_template_kwargs), secrets) if gen else {},
        reasoning_parser=str(parser) if isinstance(parser, str) else None,
        max_tokens=gen.max_tokens if gen else 0)


def read(run_dir: Path) -> Provenance | None:
    try:
        return provenance_decoder.decode((run_dir / PROVENANCE_FILE).read_bytes())
    except FileNotFoundError:
        return None


def same(a: Capture, b: Capture) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in SAME)


def record(run_dir: Path, new: Capture) -> tuple[Provenance, bool]:
    """Add `new` to RUN_DIR/provenance.json (durably) unless it is the last one again; the
    file now, and whether it changed. An unreadable file is kept aside, never lost."""
    path = run_dir / PROVENANCE_FILE
    try:
        doc = read(run_dir)
    except (msgspec.DecodeError, msgspec.ValidationError):
        os.replace(path, path.with_name(f"{PROVENANCE_FILE}.unreadable.{int(time.time())}"))
        doc = None
    if doc is not None and doc.captures and same(doc.last, new):
        return doc, False
    doc = Provenance(VERSION, [*(doc.captures if doc else []), new])
    atomic_write(path, json.dumps(msgspec.to_builtins(doc), indent=1).encode() + b"\n")
    return doc, True


def s3_key(spec: RunSpec, run_dir: Path) -> str | None:
    """Where the run's provenance goes in S3: beside its journals (a campaign node's under its
    node and run id); None without [s3]."""
    if spec.s3 is None:
        return None
    from agents.engine.uploader import RUN_FOLDER, journal_key

    if spec.queue is not None:
        from agents.queue.layout import Layout
        from agents.queue.worker import member_file

        try:  # read, never made here: the engine makes the run id once
            run_id = msgspec.json.decode(member_file(run_dir).read_bytes())["run_id"]
        except (FileNotFoundError, KeyError, TypeError, msgspec.DecodeError):
            return None
        return Layout(spec.s3.prefix).journal(spec.queue.node, str(run_id), PROVENANCE_FILE)
    return journal_key(spec.s3, RUN_FOLDER, PROVENANCE_FILE)


def put_s3(spec: RunSpec, run_dir: Path) -> str | None:
    """Copy provenance.json to S3; its key, or None without [s3] (or, on a campaign node,
    before the engine made the run's id: called again then)."""
    key = s3_key(spec, run_dir)
    if key is None or spec.s3 is None:
        return None
    from agents.engine.uploader import make_s3_client

    body = (run_dir / PROVENANCE_FILE).read_bytes()
    make_s3_client(spec.s3).put_object(Bucket=spec.s3.bucket, Key=key, Body=body,
                                       ContentType="application/json")
    return key


async def capture_live(spec: RunSpec, run_dir: Path, url: str, launch_script: Path | None,
                       s3_wait_s: float = 600.0) -> Provenance:
    """On the supervisor's loop, when its first server is ready: ask the server's
    `/server_info` (`/get_server_info` before 0.5.6), record the capture, then copy the file
    to S3 (a campaign node's once its engine has made the run id; S3 errors retried).
    ProvenanceError, nothing recorded, when neither path answers with a JSON object (a capture
    without the server's args says nothing): the supervisor tries again later."""
    import asyncio
    import logging

    import httpx

    log = logging.getLogger("fleetdeck.provenance")
    key = spec.servers.api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    info: dict[str, Any] | None = None
    answers: list[str] = []
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        for path in ("/server_info", "/get_server_info"):
            resp = await client.get(f"{url}{path}", headers=headers)
            if resp.status_code != 200:
                answers.append(f"{path} answered {resp.status_code}")
                continue
            try:
                body = resp.json()
            except ValueError:
                body = None
            if isinstance(body, dict):
                info = body
                break
            answers.append(f"{path} answered 200 with no JSON object")
    if info is None:
        raise ProvenanceError(f"{url}: no server info: {'; '.join(answers)}")
    script = None
    if launch_script is not None:
        try:
            script = launch_script.read_text()
        except OSError:
            script = None
    new = await asyncio.to_thread(capture, spec, info, script)
    doc, changed = await asyncio.to_thread(record, run_dir, new)
    log.info("provenance %s: SGLang %s, %d model files hashed", "recorded" if changed else
             "unchanged", new.sglang_version, len(new.model_files))
    if spec.s3 is None:
        return doc
    deadline = time.monotonic() + s3_wait_s
    while time.monotonic() < deadline:
        try:
            if await asyncio.to_thread(put_s3, spec, run_dir) is not None:
                break
        except Exception as exc:  # boto's errors are many; each is said and retried
            log.warning("provenance to S3: %s: %s; trying again", type(exc).__name__, exc)
        await asyncio.sleep(5.0)
    return doc
