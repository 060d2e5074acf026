"""The artifact manifest of a run directory: every file with its size, mtime and sha256, for
`pull` and `decommission-check` on the console.

Closed batches take their sha256 from uploads.jsonl (the engine hashed them when it closed
them: no re-read of gigabytes); other files are hashed on demand, with a cache keyed by
(path, size, mtime_ns) kept in RUN_DIR/.manifest_cache.json. The walk uses lstat and never
follows a symlink: one is listed as refused, its target neither read nor served. The run's
secrets file (RUN_DIR/secrets.json) is never listed: what the manifest omits, pull never copies.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import msgspec

from agents.rundir.atomic import atomic_write
from agents.rundir.batchnames import parse_batch_name
from agents.rundir.browse import OutsideRunDir
from agents.rundir.schema import (
    ArtifactKind,
    ManifestEntry,
    ManifestPage,
    UploadRecord,
    upload_decoder,
)
from agents.rundir.secrets import SECRETS_NAME
from agents.rundir.spec import SpecError, load_run_spec

CACHE_NAME = ".manifest_cache.json"
MAX_LIMIT = 5000

# Top-level files that hold the run's state (the rest of the top level is "other").
STATE_FILES = frozenset({
    "run.toml", "run.base", "run.pin.json", "control.json", "progress.json", "failures.jsonl",
    "uploads.jsonl", "history.jsonl", "control.log.jsonl", "servers.json",
})
# Top-level files that mean something only while the supervisor lives (where its socket is,
# its pid): not artifacts, so never listed, pulled or waited for by the gate.
RUNTIME_FILES = frozenset({"agent.sock.path", "supervisor.pid"})


def wire_name(rel: str) -> tuple[str, str] | None:
    """For a name that is not UTF-8 (os gives it with surrogate escapes), what JSON can carry:
    (the name shown with \\xNN escapes, its bytes in base64); None for a UTF-8 name."""
    try:
        rel.encode()
        return None
    except UnicodeEncodeError:
        raw = os.fsencode(rel)
        return raw.decode("utf-8", "backslashreplace"), base64.b64encode(raw).decode()


def skipped(name: str) -> bool:
    """Locks, temporary files (atomic writes, checkpoints being written) and our own cache."""
    return (name.endswith(".lock") or (name.startswith(".") and name.endswith(".tmp"))
            or name.startswith(".tmp-") or name == CACHE_NAME)


def kind_of(rel: str, checkpoint_dir: str | None) -> ArtifactKind:
    parts = rel.split("/")
    if parts[0] == "completions" and len(parts) == 2:
        b = parse_batch_name(parts[1])
        if b is not None:
            return "open_batch" if b.open else "batch"
        return "state" if parts[1] == ".done_indices" else "other"
    if parts[0] == "logs":
        return "log"
    if parts[0] == "launch":
        return "launch"
    if checkpoint_dir and rel.startswith(checkpoint_dir + "/"):
        return "checkpoint"
    if len(parts) == 1:
        if rel in STATE_FILES:
            return "state"
        if rel.endswith(".log"):
            return "log"
    return "other"


def request_path(run_dir: Path, value: object, what: str) -> str:
    """A path from a request, normalised ('' for the whole run directory). Absolute paths,
    '..' and a symlink on the way are refused; the last component may be a symlink (it is
    listed as refused, not followed)."""
    if not isinstance(value, str) or "\x00" in value:
        raise OutsideRunDir(f"{what} must be a path relative to the run dir, got {value!r}")
    rel = PurePosixPath(value)
    if rel.is_absolute():
        raise OutsideRunDir(f"{what} {value}: absolute paths are refused; give a path in the "
                            "run dir")
    if ".." in rel.parts:
        raise OutsideRunDir(f"{what} {value}: '..' is refused")
    parts = [p for p in rel.parts if p != "."]
    path = run_dir
    for part in parts[:-1]:
        path = path / part
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise OutsideRunDir(f"{what} {value}: {part} is a symbolic link; refused")
        except FileNotFoundError:
            break
    return "/".join(parts)


def open_confined(run_dir: Path, rel: str) -> int:
    """A file descriptor for RUN_DIR/rel, opened one component at a time with O_NOFOLLOW: a
    symlink anywhere on the way (put there after the walk, say) fails the open. Non-blocking:
    a FIFO put there would otherwise hold the open until someone writes to it (the caller
    checks the file is regular; a regular file's reads do not care)."""
    parts = rel.split("/")
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    finally:
        os.close(fd)


def hash_file(run_dir: Path, rel: str) -> tuple[str, int, int]:
    """sha256 of the first `size` bytes of RUN_DIR/rel, where size and mtime are the open
    file's own (a file being appended to grows past them; one replaced meanwhile is the new
    one, whole). Returns (sha256, size, mtime_ns)."""
    for _ in range(3):
        fd = open_confined(run_dir, rel)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{rel}: not a regular file")
            sha = hashlib.sha256()
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 22))
                if not chunk:
                    break  # cut meanwhile (a torn tail): read it again
                sha.update(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        if left == 0:
            return sha.hexdigest(), st.st_size, st.st_mtime_ns
    raise OSError(f"{rel}: keeps shrinking while it is read")


class HashCache:
    """RUN_DIR/.manifest_cache.json: {path: [size, mtime_ns, sha256]}. Written whole by atomic
    replace, so two agents answering at once lose an update at worst, never the file."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CACHE_NAME
        self.files: dict[str, tuple[int, int, str]] = {}
        self.dirty = False
        try:
            raw = msgspec.json.decode(self.path.read_bytes(), type=dict[str, tuple[int, int, str]])
            self.files = raw
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            self.files = {}  # absent or unreadable: hash again

    def get(self, rel: str, size: int, mtime_ns: int) -> str | None:
        hit = self.files.get(rel)
        if hit is not None and hit[0] == size and hit[1] == mtime_ns:
            return hit[2]
        return None

    def put(self, rel: str, size: int, mtime_ns: int, sha256: str) -> None:
        if wire_name(rel) is not None:
            return  # not UTF-8: JSON cannot hold the name; hashed again next time
        self.files[rel] = (size, mtime_ns, sha256)
        self.dirty = True

    def save(self, existing: set[str]) -> None:
        gone = [rel for rel in self.files if rel not in existing]
        for rel in gone:
            del self.files[rel]
        if self.dirty or gone:
            try:
                atomic_write(self.path, msgspec.json.encode(self.files), durable=False)
            except OSError:
                pass  # a read-only run dir: the cache is an optimisation only
            self.dirty = False


def read_uploads(run_dir: Path) -> dict[str, UploadRecord]:
    """uploads.jsonl by batch file name, the last record winning; a torn or unreadable line is
    passed over (verify names it)."""
    out: dict[str, UploadRecord] = {}
    try:
        with open(run_dir / "uploads.jsonl", "rb") as f:
            for raw in f:
                try:
                    rec = upload_decoder.decode(raw)
                except msgspec.DecodeError:
                    continue
                out[rec.batch] = rec
    except FileNotFoundError:
        pass
    return out


@dataclass(slots=True)
class Found:
    rel: str
    st: os.stat_result
    symlink: bool


def walk(run_dir: Path) -> list[Found]:
    """Every file under run_dir by lstat, sorted by relative path. Symlinks are reported, not
    followed; sockets, fifos and skipped names are left out."""
    found: list[Found] = []
    todo: list[tuple[Path, str]] = [(run_dir, "")]
    while todo:
        folder, base = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # vanished or unreadable folder: nothing in it can be served
        for entry in entries:
            if skipped(entry.name) or (not base and entry.name == SECRETS_NAME):
                continue  # secrets.json: never listed, so never served or pulled
            if not base and entry.name in RUNTIME_FILES:
                continue
            rel = base + entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                found.append(Found(rel, st, True))
            elif stat.S_ISDIR(st.st_mode):
                todo.append((Path(entry.path), rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                found.append(Found(rel, st, False))
    found.sort(key=lambda f: f.rel)
    return found


def checkpoint_dir(run_dir: Path) -> str | None:
    """The training output folder relative to RUN_DIR, when the run spec names one inside."""
    try:
        spec = load_run_spec(run_dir)
    except (SpecError, OSError):
        return "checkpoints"
    if spec.train is None:
        return "checkpoints"
    out = Path(spec.train.output)
    if not out.is_absolute():
        return PurePosixPath(*out.parts).as_posix()
    try:
        return out.relative_to(run_dir).as_posix()
    except ValueError:
        return None


class Manifest:
    """The manifest of one run directory, built on each call (the walk is cheap; hashes are
    cached)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def page(self, offset: int = 0, limit: int = 1000, prefix: object = "",
             path: object = None) -> ManifestPage:
        """Entries [offset, offset+limit) of those under `prefix` (or the one at `path`),
        sorted by path. Only the entries of the page are hashed."""
        exact = request_path(self.run_dir, path, "path") if path is not None else None
        under = request_path(self.run_dir, prefix or "", "prefix")
        found = walk(self.run_dir)
        if exact is not None:
            chosen = [f for f in found if f.rel == exact]
        else:
            chosen = [f for f in found
                      if not under or f.rel == under or f.rel.startswith(under + "/")]
        limit = max(1, min(limit, MAX_LIMIT))
        piece = chosen[offset:offset + limit]
        cache = HashCache(self.run_dir)
        uploads = read_uploads(self.run_dir)
        ckpt = checkpoint_dir(self.run_dir)
        entries = [self._entry(f, cache, uploads, ckpt) for f in piece]
        cache.save({f.rel for f in found if not f.symlink})
        end = offset + len(piece)
        return ManifestPage(entries=entries, total=len(chosen),
                            next_offset=end if end < len(chosen) else None)

    def entries(self, prefix: str = "") -> list[ManifestEntry]:
        """The whole manifest (for the CLI)."""
        out: list[ManifestEntry] = []
        offset: int | None = 0
        while offset is not None:
            page = self.page(offset, MAX_LIMIT, prefix)
            out += page.entries
            offset = page.next_offset
        return out

    def _entry(self, f: Found, cache: HashCache, uploads: dict[str, UploadRecord],
               ckpt: str | None) -> ManifestEntry:
        st = f.st
        kind = kind_of(f.rel, ckpt)
        entry = ManifestEntry(path=f.rel, kind=kind, size=st.st_size,
                              mtime=st.st_mtime_ns / 1e9, mtime_ns=st.st_mtime_ns, sha256=None)
        wire = wire_name(f.rel)
        if wire is not None:
            entry.path, entry.path_b64 = wire
        if f.symlink:
            entry.size = 0
            entry.refused = "symlink"
            return entry
        rec = uploads.get(f.rel.rsplit("/", 1)[-1]) if kind == "batch" else None
        # A batch written after its upload was recorded has changed since: read it again.
        if rec is not None and rec.size == st.st_size and \
                st.st_mtime_ns <= rec.uploaded_at * 1e9:
            entry.sha256, entry.sha256_from, entry.in_s3 = rec.sha256, "uploads", True
            return entry
        sha = cache.get(f.rel, st.st_size, st.st_mtime_ns)
        if sha is not None:
            entry.sha256, entry.sha256_from = sha, "cache"
        else:
            try:
                sha, size, mtime_ns = hash_file(self.run_dir, f.rel)
            except OSError:
                entry.refused = "unreadable"
                return entry
            # Appended to or replaced since the walk: describe the bytes that were hashed.
            entry.size, entry.mtime_ns, entry.mtime = size, mtime_ns, mtime_ns / 1e9
            cache.put(f.rel, entry.size, entry.mtime_ns, sha)
            entry.sha256, entry.sha256_from = sha, "read"
        entry.in_s3 = rec is not None and rec.size == entry.size and rec.sha256 == entry.sha256
        return entry
