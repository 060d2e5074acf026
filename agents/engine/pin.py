"""run.pin.json: what the indices of a run mean (the prompts file by size, mtime and sha256,
the model, sampling and template arguments). Pinned at first launch; a resume against
anything else is refused. A run with [s3] keeps a copy in S3, for `resume-from-s3`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from agents.engine import EngineError
from agents.engine import prompts as prompt_io
from agents.engine.uploader import (
    RUN_FOLDER,
    S3Unavailable,
    journal_key,
    precondition_failed,
)
from agents.rundir.atomic import atomic_write
from agents.rundir.schema import RunPin, encoder, pin_decoder
from agents.rundir.spec import RunSpec, S3Section

PIN_FILE = "run.pin.json"


def check_pin(spec: RunSpec, run_dir: Path) -> RunPin:
    """First launch pins what the indices mean; a resume against anything else is refused."""
    gen = spec.generate
    assert gen is not None
    path = run_dir / PIN_FILE
    prompts = spec.prompts_path
    st = prompts.stat()
    if not prompt_io.has_prompts(prompts):
        raise EngineError(f"{prompts}: the prompts file is empty ({st.st_size} bytes, no "
                          "line but whitespace): nothing to generate; [generate] prompts in "
                          f"{spec.source} must name a JSONL file of prompts")
    if path.exists():
        pin = pin_decoder.decode(path.read_bytes())
        # Same size and mtime: the file is the pinned one (no 3 GB re-hash at every resume).
        unchanged = st.st_size == pin.prompts_size and st.st_mtime_ns == pin.prompts_mtime_ns
        if not unchanged and (st.st_size != pin.prompts_size or not _same_hash(prompts, pin)):
            raise EngineError(
                f"{prompts}: the prompts file changed since this run was pinned "
                f"({path}: {pin.prompts_lines} lines, sha256 {pin.prompts_sha256[:12]}...). "
                "Indices would point at other prompts: restore the file or use a new run dir."
            )
        problem = spec_problem(spec, pin, str(path))
        if problem is not None:
            raise EngineError(problem)
        return pin
    sha, lines, size = prompt_io.scan(prompts)
    pin = RunPin(prompts_path=str(prompts), prompts_sha256=sha, prompts_lines=lines,
                 prompts_size=size, prompts_mtime_ns=st.st_mtime_ns, model=spec.model_name,
                 sampling=gen.sampling, chat_template_kwargs=gen.chat_template_kwargs,
                 created_at=time.time())
    atomic_write(path, encoder.encode(pin))
    return pin


def spec_problem(spec: RunSpec, pin: RunPin, where: str) -> str | None:
    """What in the spec differs from the pin (`where` it was read), or None."""
    gen = spec.generate
    assert gen is not None
    for key, now, then in (
        ("[generate] model", spec.model_name, pin.model),
        ("[generate] sampling", gen.sampling, pin.sampling),
        ("[generate] chat_template_kwargs", gen.chat_template_kwargs, pin.chat_template_kwargs),
    ):
        if now != then:
            return (f"{spec.source}: {key} is {now!r} but the run was pinned with {then!r} "
                    f"({where}); a resume may not change it")
    return None


MEANING = ("prompts_sha256", "prompts_lines", "prompts_size", "model", "sampling",
           "chat_template_kwargs")


def same_meaning(a: RunPin, b: RunPin) -> bool:
    """Two pins of one run: the same prompts (by content), model and sampling; where
    the file lies and its mtime may differ (a run resumed on another machine)."""
    return all(getattr(a, f) == getattr(b, f) for f in MEANING)



def pin_key(s3: S3Section) -> str:
    return journal_key(s3, RUN_FOLDER, PIN_FILE)


def read_s3_pin(client: Any, s3: S3Section) -> RunPin | None:
    """The pin a run put in S3 at launch; None when there is none."""
    from botocore.exceptions import ClientError

    key = pin_key(s3)
    try:
        data = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    try:
        return pin_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise EngineError(f"s3://{s3.bucket}/{key}: unreadable pin: {exc}") from None


def publish_pin(client: Any, s3: S3Section, pin: RunPin) -> None:
    """At every start: the pin in S3 (`journals/run/run.pin.json`), what
    `resume-from-s3` checks a new machine's prompts file against. Put only where none is;
    one there that means another run is refused (two runs on one prefix mix their
    batches). Blocking."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _publish(client, s3, pin)
    except (BotoCoreError, ClientError) as exc:
        raise S3Unavailable(f"s3://{s3.bucket}/{pin_key(s3)}: cannot read or put the "
                            f"run's pin: {exc}") from None


def _publish(client: Any, s3: S3Section, pin: RunPin) -> None:
    key = pin_key(s3)
    for _ in range(2):
        there = read_s3_pin(client, s3)
        if there is not None:
            if not same_meaning(there, pin):
                raise EngineError(
                    f"s3://{s3.bucket}/{key} pins another run (prompts sha256 "
                    f"{there.prompts_sha256}, model {there.model!r}; this run: sha256 "
                    f"{pin.prompts_sha256}, model {pin.model!r}): give this run its own "
                    "[s3] prefix")
            return
        try:
            client.put_object(Bucket=s3.bucket, Key=key, Body=encoder.encode(pin),
                              ContentType="application/json", IfNoneMatch="*")
            return
        except Exception as exc:
            if not precondition_failed(exc):
                raise
            # Put by another start a moment ago: compare with it.
    raise EngineError(f"s3://{s3.bucket}/{key}: neither readable nor writable")


def _same_hash(prompts: Path, pin: RunPin) -> bool:
    sha, _, _ = prompt_io.scan(prompts)
    return sha == pin.prompts_sha256
