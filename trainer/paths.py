"""Where a training run's inputs and outputs are, resolved from its run.toml.

`data`, `target` and `tokenizer` are relative to the spec's folder (like `[generate]
prompts`); `prepared` and `output` to the run directory, next to `progress.json`, so that
the agent's manifest and the console's pull see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.rundir.spec import RunSpec, SpecError, TrainSection, load_spec


@dataclass(frozen=True)
class TrainPaths:
    run_dir: Path
    data: str
    target: str
    tokenizer: str
    prepared: Path
    output: Path

    @property
    def progress(self) -> Path:
        return self.run_dir / "progress.json"


def load_train_spec(path: str | Path) -> tuple[RunSpec, TrainSection]:
    spec = load_spec(path)
    if spec.train is None:
        raise SpecError(f"{path}: [train]: missing (the trainer needs it)")
    return spec, spec.train


def _local(base: Path, value: str) -> str:
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    candidate = base / p
    # A Hugging Face hub id ("Qwen/Qwen3-8B") stays as it is when no such folder exists.
    return str(candidate) if candidate.exists() or not _looks_like_hub_id(value) else value


def _looks_like_hub_id(value: str) -> bool:
    return value.count("/") == 1 and not value.startswith((".", "~"))


def resolve(spec: RunSpec, train: TrainSection) -> TrainPaths:
    base = spec.base_dir
    run_dir = spec.run_dir
    data = train.data if train.data.startswith("s3://") else str(base / Path(train.data)
                                                                  .expanduser())
    target = _local(base, train.target)
    tokenizer = _local(base, train.tokenizer) if train.tokenizer else target

    def under_run(value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else run_dir / p

    return TrainPaths(run_dir, data, target, tokenizer, under_run(train.prepared),
                      under_run(train.output))
