"""Sealed folders: a folder of files that appears whole or not at all, and that says whether
it is still whole. A checkpoint (or an export) is written into a temporary folder; `commit`
fsyncs every file, writes MANIFEST (each file's size and sha256) and fsyncs it, fsyncs the
folder, renames it into place and fsyncs the parent. Only then is it called written, and only
then may older ones be removed. `check` reads it back against its manifest.

Format-agnostic: whatever the caller put in the folder (safetensors and torch.save today,
torch.distributed.checkpoint's files later, subfolders included) is sealed the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import msgspec

from agents.rundir.atomic import fsync_dir

MANIFEST = "manifest.sha256.json"
CHUNK = 4 << 20


class SealedFile(msgspec.Struct):
    path: str  # relative, "/"-separated
    size: int
    sha256: str


class Manifest(msgspec.Struct):
    files: list[SealedFile]


def _files(folder: Path) -> list[Path]:
    """Every file below `folder` but the manifest, sorted (symlinks are refused: a sealed
    folder holds its bytes)."""
    out = []
    for here, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(here, name)
            if path.is_symlink():
                raise OSError(f"{path}: a symbolic link in a folder to seal")
            if path.parent != folder or name != MANIFEST:
                out.append(path)
    return out


def _digest(path: Path, sync: bool) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
        if sync:
            os.fsync(f.fileno())
    return size, h.hexdigest()


def seal(folder: Path) -> Manifest:
    """fsync every file of `folder`, then write its manifest and fsync that, then every
    folder in it, deepest first."""
    files = []
    for path in _files(folder):
        size, sha = _digest(path, sync=True)
        files.append(SealedFile(path.relative_to(folder).as_posix(), size, sha))
    manifest = Manifest(files)
    with open(folder / MANIFEST, "wb") as f:
        f.write(msgspec.json.encode(manifest))
        f.flush()
        os.fsync(f.fileno())
    for here, _, _ in sorted(os.walk(folder), key=lambda w: -len(Path(w[0]).parts)):
        fsync_dir(Path(here))
    return manifest


def commit(tmp: Path, final: Path) -> None:
    """Seal `tmp` and put it at `final` (a folder beside it), durably. An older `final` is
    moved aside first and removed only once the new one's name is durable: at every moment
    a power loss leaves the old folder or the new one under that name."""
    seal(tmp)
    aside = final.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if aside.exists():
        remove(aside)


def remove(folder: Path) -> None:
    """Remove a folder so that it never shows under its name half removed: renamed to a
    hidden name (the rename fsynced), then deleted."""
    if not folder.name.startswith("."):
        trash = folder.parent / f".trash-{folder.name}-{os.getpid()}"
        os.replace(folder, trash)
        fsync_dir(folder.parent)
        folder = trash
    shutil.rmtree(folder, ignore_errors=True)


def check(folder: Path, hashes: bool = True) -> str | None:
    """Why `folder` is not whole as sealed (None when it is): no readable manifest, or a file
    it names missing, of another size or (with `hashes`) another sha256. Files added after
    the seal (a checkpoint's evaluation.json) are not its business."""
    try:
        manifest = msgspec.json.decode((folder / MANIFEST).read_bytes(), type=Manifest)
    except FileNotFoundError:
        return f"no {MANIFEST} (not sealed: written before sealed checkpoints, or not whole)"
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"{MANIFEST} unreadable: {exc}"
    for f in manifest.files:
        path = folder / f.path
        try:
            size = path.stat().st_size
            if size != f.size:
                return f"{f.path}: {size} bytes, the manifest says {f.size}"
            if hashes and _digest(path, sync=False)[1] != f.sha256:
                return f"{f.path}: sha256 differs from the manifest"
        except FileNotFoundError:
            return f"{f.path}: missing"
        except OSError as exc:
            return f"{f.path}: cannot read: {exc}"
    return None


def is_sealed(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


__all__ = ["MANIFEST", "check", "commit", "is_sealed", "remove", "seal"]
