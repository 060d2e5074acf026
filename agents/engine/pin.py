"""run.pin.json: what the indices of a run mean (the prompts file by size, mtime and sha256,
the model, sampling and template arguments). Pinned at first launch; a resume against
anything else is refused."""

from __future__ import annotations

import time
from pathlib import Path

from agents.engine import EngineError
from agents.engine import prompts as prompt_io
from agents.rundir.atomic import atomic_write
from agents.rundir.schema import RunPin, encoder, pin_decoder
from agents.rundir.spec import RunSpec


def check_pin(spec: RunSpec, run_dir: Path) -> RunPin:
    """First launch pins what the indices mean; a resume against anything else is refused."""
    gen = spec.generate
    assert gen is not None
    path = run_dir / "run.pin.json"
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
        for key, now, then in (
            ("[generate] model", spec.model_name, pin.model),
            ("[generate] sampling", gen.sampling, pin.sampling),
            ("[generate] chat_template_kwargs", gen.chat_template_kwargs,
             pin.chat_template_kwargs),
            ("[generate] shard", gen.shard, pin.shard),
        ):
            if now != then:
                raise EngineError(f"{spec.source}: {key} is {now!r} but the run was pinned with "
                                  f"{then!r} ({path}); a resume may not change it")
        return pin
    sha, lines, size = prompt_io.scan(prompts)
    pin = RunPin(prompts_path=str(prompts), prompts_sha256=sha, prompts_lines=lines,
                 prompts_size=size, prompts_mtime_ns=st.st_mtime_ns, model=spec.model_name,
                 sampling=gen.sampling, chat_template_kwargs=gen.chat_template_kwargs,
                 created_at=time.time(), shard=gen.shard)
    atomic_write(path, encoder.encode(pin))
    return pin


def _same_hash(prompts: Path, pin: RunPin) -> bool:
    sha, _, _ = prompt_io.scan(prompts)
    return sha == pin.prompts_sha256
