"""`fleetdeck-train export`: the folder SGLang serves as a DFLASH draft model.

From a checkpoint (the best by default): `config.json` with every key the loaders' contract
asks for and dtype bfloat16, `model.safetensors` in bfloat16, `dflash.py`, the target's
tokenizer files (with `<|MASK|>` added where the mask token is the first free embedding row,
as SGLang and SpecForge add it), `README.md` with the SGLang command and the tau that
`evaluate` measured, and `export.json` (this report). It is written beside the destination
and swapped in whole; the default destination, RUN_DIR/export/, is inside the run, so `pull`
takes it.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from agents.rundir.atomic import make_dirs
from agents.rundir.spec import RunSpec, TrainSection
from trainer import checkpoint as ckpt
from trainer import contract, sealed
from trainer.contract import MASK_TOKEN, TargetFacts
from trainer.drafter import DFlashDraftModel
from trainer.evaluate import EvalReport, read_evaluation
from trainer.paths import resolve
from trainer.target import target_facts

MARKER = "export.json"
README = "README.md"


class ExportError(ValueError):
    """The export cannot be made (exit 2); the message names the file and why."""


class ExportReport(msgspec.Struct):
    checkpoint: str
    out: str
    step: int | None
    target: str
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int
    # The string the exported tokenizer maps to mask_token_id (None: no token string).
    mask_token: str | None
    mask_token_added: bool
    tau: float | None
    tau_prompts: int | None
    files: list[str]
    sglang_args: list[str]
    created_at: float = msgspec.field(default_factory=time.time)


def sglang_args(target: str, out: Path, block_size: int) -> list[str]:
    return ["python", "-m", "sglang.launch_server", "--model-path", target,
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(out),
            "--speculative-num-draft-tokens", str(block_size)]


def _write_tokenizer(folder: Path, tokenizer: Any, mask_id: int) -> tuple[str | None, bool]:
    """Save the tokenizer; add `<|MASK|>` when the mask is the first row past it."""
    added = False
    if MASK_TOKEN not in tokenizer.get_vocab() and mask_id == len(tokenizer):
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        added = True
        got = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if got != mask_id:
            raise ExportError(f"the tokenizer put {MASK_TOKEN} at {got}, not at the drafter's "
                              f"mask token {mask_id}")
    tokenizer.save_pretrained(str(folder))
    token = tokenizer.convert_ids_to_tokens(mask_id) if mask_id < len(tokenizer) else None
    return (str(token) if token is not None else None), added


def _mask_line(report: ExportReport, facts: TargetFacts) -> str:
    m = report.mask_token_id
    if report.mask_token_added:
        return (f"{m}: `{MASK_TOKEN}`, which the target's tokenizer lacks. Row {m} is the "
                f"first embedding row past its {m} tokens (the target has {facts.vocab_rows} "
                f"rows); this folder's tokenizer adds `{MASK_TOKEN}` there, as SGLang would")
    if report.mask_token is not None:
        return f"{m}: `{report.mask_token}` in the target's tokenizer"
    return (f"{m}: an embedding row with no token string; SGLang takes it from "
            "`dflash_config.mask_token_id`")


def _readme(report: ExportReport, drafter: DFlashDraftModel, facts: TargetFacts,
            evaluation: EvalReport | None) -> str:
    cfg = drafter.config
    params = sum(p.numel() for p in drafter.parameters())
    if evaluation is not None:
        tau = (f"{evaluation.tau:.2f} tokens per target forward over {evaluation.prompts} "
               f"held-out prompts (`fleetdeck-train evaluate`, greedy; {evaluation.equal} "
               f"outputs equal to the target's greedy decoding, {evaluation.near_ties} near "
               f"ties, {evaluation.mismatches} mismatches)")
    else:
        tau = (f"not measured: run `fleetdeck-train evaluate RUN.toml --checkpoint "
               f"{report.checkpoint}`, then export again")
    layers = f"{cfg.num_hidden_layers} Qwen3 layer" + ("s" if cfg.num_hidden_layers != 1 else "")
    # A table cell: the token's own pipes must not split it.
    mask = _mask_line(report, facts).replace("|", "\\|")
    a = report.sglang_args
    command = " \\\n    ".join([" ".join(a[:3]), *(f"{a[i]} {a[i + 1]}"
                                                   for i in range(3, len(a), 2))])
    return f"""# DFlash drafter for {report.target}

Exported by `fleetdeck-train export` from `{report.checkpoint}` (step {report.step}).

| | |
|---|---|
| tau | {tau} |
| block size | {report.block_size} |
| drafter | {layers}, width {cfg.hidden_size}, {params:,} weights |
| target features | layers {report.target_layer_ids} of {facts.num_layers} (hidden_states[i+1]) |
| mask token | {mask} |

## Serve it with SGLang

```
{command}
```

SGLang builds the model from `architectures` (`DFlashDraftModel`) and reads the block size,
the target layers and the mask token from `config.json`; the embeddings and the LM head are the
target's. The block size flag repeats the config's, so that SGLang never drafts another size.
If this folder moves, change `--speculative-draft-model-path`.

## Load it with transformers (4.57 or 5.x)

```python
from transformers import AutoModel
drafter = AutoModel.from_pretrained("{report.out}", trust_remote_code=True)
```

`dflash.py` is the drafter's own code; its `forward` takes z-lab's keyword arguments
(`position_ids`, `attention_mask`, `noise_embedding`, `target_hidden`, `past_key_values`).
"""


def _refuse_foreign(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / MARKER).exists())):
        raise ExportError(f"{out}: exists and is not an export (no {MARKER}); give another "
                          "--to or move it away")


def _step(source: Path) -> int | None:
    try:
        return msgspec.json.decode((source / "metrics.json").read_bytes(),
                                   type=ckpt.Metrics).step
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        m = ckpt.NAME.match(source.name)
        return int(m.group(2)) if m else None


def export(spec: RunSpec, cfg: TrainSection, which: str = "best",
           to: str | None = None) -> ExportReport:
    from transformers import AutoTokenizer

    paths = resolve(spec, cfg)
    source = ckpt.choose(paths.output, which)
    facts = target_facts(paths.target)
    drafter = ckpt.load_drafter(source, facts)
    tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
    problem = contract.mask_token_problem(tokenizer, drafter.mask_token_id)
    if problem:
        raise ExportError(f"{source / contract.CONFIG}: {problem}")
    out = Path(to).expanduser().absolute() if to else paths.run_dir / "export"
    _refuse_foreign(out)
    make_dirs(out.parent)
    # Older checkpoints lack the target's depth; the run's target supplies it.
    drafter.config.num_target_layers = facts.num_layers
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        ckpt.write_drafter(tmp, drafter, torch.bfloat16)
        mask_token, added = _write_tokenizer(tmp, tokenizer, drafter.mask_token_id)
        evaluation = read_evaluation(source)
        report = ExportReport(
            checkpoint=str(source), out=str(out), step=_step(source), target=paths.target,
            block_size=drafter.block_size, target_layer_ids=drafter.target_layer_ids,
            mask_token_id=drafter.mask_token_id, mask_token=mask_token,
            mask_token_added=added, tau=evaluation.tau if evaluation else None,
            tau_prompts=evaluation.prompts if evaluation else None, files=[],
            sglang_args=sglang_args(paths.target, out, drafter.block_size))
        (tmp / README).write_text(_readme(report, drafter, facts, evaluation))
        report.files = sorted([*(p.name for p in tmp.iterdir()), MARKER, sealed.MANIFEST])
        (tmp / MARKER).write_bytes(msgspec.json.format(msgspec.json.encode(report)))
        # What was written must meet the whole contract; a failure here is a bug of ours.
        contract.check(tmp, facts, full=True)
        # Sealed and renamed into place durably; an older export is removed only after.
        sealed.commit(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report
