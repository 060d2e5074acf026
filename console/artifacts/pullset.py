"""What a pull takes and where it puts it: the node's manifest fetched page by page, the pull
set (by default everything but completion batches that S3 holds verified; for a training run,
progress, logs and the latest and best checkpoints only), and local paths that never leave
the pull's destination."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from agents.rundir.schema import ManifestEntry, ManifestPage
from console.artifacts.sources import PullError
from console.fleet import Node

CHECKPOINT_RE = re.compile(r"^epoch_\d+_step_\d+$")
STATE_DIR = ".fleetdeck"


def safe_rel(path: str) -> str:
    """A manifest path as a local relative path: never absolute, never '..'."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise PullError(f"manifest path {path!r} leaves the run directory; refused")
    return str(rel)


async def fetch_manifest(call: Callable[..., Any]) -> list[ManifestEntry]:
    entries: list[ManifestEntry] = []
    offset: int | None = 0
    while offset is not None:
        raw = await call("manifest", {"offset": offset, "limit": 5000})
        page = msgspec.convert(raw, ManifestPage)
        entries += page.entries
        offset = page.next_offset
    return entries


def pull_set(entries: list[ManifestEntry], role: str, everything: bool,
             train: dict[str, Any] | None = None) -> list[ManifestEntry]:
    """What must be here before the node may go: by default everything but completion
    batches that S3 holds verified; for training, the latest and best checkpoints only."""
    keep_ckpt: set[str] = set()
    if train:
        for key in ("last_checkpoint", "best_checkpoint"):
            value = train.get(key)
            if isinstance(value, str) and value:
                keep_ckpt.add(value.rstrip("/").split("/")[-1])
    chosen = []
    for e in entries:
        if e.refused is not None:
            continue
        if e.kind == "batch" and e.in_s3 and not everything:
            continue
        if e.kind == "checkpoint" and not everything and role == "train":
            # Of the epoch_E_step_S folders only the latest and the best; files beside them
            # (best.json) come too.
            folders = [p for p in e.path.split("/") if CHECKPOINT_RE.match(p)]
            if folders and not any(p in keep_ckpt for p in folders):
                continue
        chosen.append(e)
    return chosen


def dest_for(pull_dir: Path, node: Node, run_name: str) -> Path:
    return pull_dir / node.name / run_name


def save_manifest(dest: Path, entries: list[ManifestEntry]) -> None:
    (dest / STATE_DIR).mkdir(parents=True, exist_ok=True)
    (dest / STATE_DIR / "manifest.json").write_bytes(msgspec.json.encode(entries))
