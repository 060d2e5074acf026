"""What a pull takes and where it puts it: the node's manifest fetched page by page, the pull
set (by default everything but completion batches that S3 holds verified; for a training run,
progress, logs and the latest and best checkpoints only), and local paths that never leave
the pull's destination: whatever the node says (its run name, its manifest's paths), every
local path is checked, resolved, against the pull dir before anything is written there."""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from agents.rundir.atomic import atomic_write, make_dirs
from agents.rundir.schema import ManifestEntry, ManifestPage
from agents.rundir.spec import name_problem
from console.artifacts.sources import PullError
from console.fleet import Node
from console.sanitize import shown

CHECKPOINT_RE = re.compile(r"^epoch_\d+_step_\d+$")
STATE_DIR = ".fleetdeck"


SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PAGE = 5000


def safe_rel(path: str) -> str:
    """A manifest path as a local relative path: never absolute, never '..', never the pull's
    own state folder. (Where it lands is checked again, resolved, by `confined`.)"""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\x00" in path:
        raise PullError(f"manifest path {shown(repr(path))} leaves the run directory; refused")
    if rel.parts[0] == STATE_DIR:
        raise PullError(f"manifest path {shown(repr(path))} is the pull's own state folder "
                        f"{STATE_DIR}; refused")
    return str(rel)


def confined(root: Path, rel: str) -> Path:
    """root/rel, refused (PullError) unless, symlinks resolved as writing would follow them, it
    is inside root resolved. The last check before anything is written there."""
    return Confiner(root)(rel)


class Confiner:
    """`confined` for many paths under one root (a pull's thousand files): the root resolved
    once and each folder once, not every component of every path each time; the same answers
    and refusals."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real_root = root.resolve()
        self._folders: dict[Path, Path] = {}

    def __call__(self, rel: str) -> Path:
        path = self.root / rel
        folder = path.parent
        real_folder = self._folders.get(folder)
        if real_folder is None:
            real_folder = folder.resolve()
            if folder.is_dir():  # one not made yet may resolve otherwise once it is
                self._folders[folder] = real_folder
        real = real_folder / path.name
        if real.is_symlink():
            real = real.resolve()
        if real == self.real_root or not real.is_relative_to(self.real_root):
            raise PullError(f"{shown(rel)}: {shown(str(path))} resolves to {shown(str(real))}, "
                            f"outside {shown(str(self.root))}; refused")
        return path


def check_page(raw: object, offset: int) -> ManifestPage:
    """One manifest page as the node sent it, refused (PullError) unless it is one: entries
    with sizes >= 0 and hex sha256s, and a next page that moves on."""
    try:
        page = msgspec.convert(raw, ManifestPage)
    except msgspec.ValidationError as exc:
        raise PullError(f"the node's manifest is malformed: {shown(str(exc))}") from None
    for e in page.entries:
        if e.path_b64 is not None:
            # A name that is not UTF-8 travels as its bytes: back to os's own form of it
            # (surrogate escapes), so the copy here has the very same name.
            try:
                e.path = base64.b64decode(e.path_b64, validate=True).decode(
                    "utf-8", "surrogateescape")
            except (binascii.Error, ValueError):
                raise PullError(f"the node's manifest is malformed: {shown(repr(e.path))} has "
                                f"path_b64 {shown(repr(e.path_b64[:80]))}, not base64") from None
        if e.size < 0:
            raise PullError(f"the node's manifest is malformed: {shown(repr(e.path))} has "
                            f"size {e.size}")
        if e.sha256 is not None and not SHA256_RE.match(e.sha256):
            raise PullError(f"the node's manifest is malformed: {shown(repr(e.path))} has "
                            f"sha256 {shown(repr(e.sha256))}, not 64 hex digits")
    if page.next_offset is not None and \
            (page.next_offset != offset + len(page.entries) or not page.entries):
        raise PullError(f"the node's manifest is malformed: the page at {offset} with "
                        f"{len(page.entries)} entries says the next is at {page.next_offset}")
    return page


async def fetch_manifest(call: Callable[..., Any]) -> list[ManifestEntry]:
    entries: list[ManifestEntry] = []
    offset: int | None = 0
    while offset is not None:
        raw = await call("manifest", {"offset": offset, "limit": PAGE})
        page = check_page(raw, offset)
        entries += page.entries
        offset = page.next_offset
    return entries


def pull_set(entries: list[ManifestEntry], role: str, everything: bool,
             train: dict[str, Any] | None = None) -> list[ManifestEntry]:
    """What must be here before the node may go: by default everything but completion
    batches that S3 holds verified; for training, the latest and best checkpoints only."""
    keep_ckpt: set[str] = set()
    if isinstance(train, dict):
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


def dest_for(pull_dir: Path, node: Node, run_name: object) -> Path:
    """PULL_DIR/NODE/RUN. The run name comes from the node, so it is trusted no more than
    anything else it sends: both names must be one plain folder name, and the folder,
    resolved, inside the pull dir; else PullError."""
    for what, name in (("node name", node.name), ("run name", run_name)):
        bad = name_problem(name) if isinstance(name, str) else "is not a string"
        if bad is not None:
            raise PullError(f"{shown(node.name)}: the {what} {shown(repr(name))} {bad}: it "
                            f"cannot be a folder of the pull dir {shown(str(pull_dir))}; "
                            "refused")
    assert isinstance(run_name, str)
    return confined(pull_dir, f"{node.name}/{run_name}")


def on_the_wire(e: ManifestEntry) -> ManifestEntry:
    """The entry as the node sent it: a name that is not UTF-8 shown escaped in `path` (its
    bytes stay in `path_b64`), so JSON can hold it."""
    if e.path_b64 is None:
        return e
    return msgspec.structs.replace(e, path=os.fsencode(e.path).decode("utf-8",
                                                                      "backslashreplace"))


LOCK_NAME = "pull.lock"


@contextmanager
def pull_lock(dest: Path) -> Iterator[None]:
    """One pull at a time per destination: an exclusive lock on DEST/.fleetdeck/pull.lock,
    held for the whole pull. The kernel drops it when the holder dies (kill -9 included), so
    a lock never outlives its pull; a second pull while one lives is refused (PullError)
    naming the live one, instead of writing the same parts beside it."""
    state = confined(dest, STATE_DIR)
    make_dirs(state)  # DEST and its parents too, each fsynced into its parent
    path = confined(dest, f"{STATE_DIR}/{LOCK_NAME}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise PullError(f"another pull is writing {shown(str(dest))} ({shown(holder)}): "
                            "two pulls must not share a destination; wait for it to end or "
                            "stop it, then pull again (it resumes)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_manifest(dest: Path, entries: list[ManifestEntry]) -> None:
    state = confined(dest, STATE_DIR)
    make_dirs(state)  # DEST and its parents too, each fsynced into its parent
    atomic_write(state / "manifest.json", msgspec.json.encode([on_the_wire(e)
                                                               for e in entries]))
