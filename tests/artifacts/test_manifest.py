"""The artifact manifest of a real run: batch hashes from uploads.jsonl, the rest hashed on
demand and cached, pagination, and confinement to RUN_DIR (symlinks, '..')."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.artifacts import manifest
from agents.rpc.methods import ControlMethods
from agents.rpc.protocol import REFUSED, RpcError


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _artifacts(run_dir: Path) -> set[str]:
    """Every regular file a reader would call an artifact, found without the code under test."""
    out = set()
    for folder, _, files in os.walk(run_dir):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink() or name.endswith(".lock") or name == ".manifest_cache.json" \
                    or (name.startswith(".") and name.endswith(".tmp")):
                continue
            out.add(path.relative_to(run_dir).as_posix())
    return out


async def _pages(run_dir: Path, limit: int, **params: Any) -> list[dict[str, Any]]:
    call = ControlMethods(run_dir).methods()["manifest"]
    entries: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = await call({"offset": offset, "limit": limit, **params})
        assert len(page["entries"]) <= limit
        entries += page["entries"]
        offset = page["next_offset"]
        assert page["total"] == len(entries) if offset is None else True
    return entries


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The relative paths the manifest reads to hash, in order."""
    seen: list[str] = []
    real = manifest.hash_file

    def counting(run_dir: Path, rel: str) -> tuple[str, int, int]:
        seen.append(rel)
        return real(run_dir, rel)

    monkeypatch.setattr(manifest, "hash_file", counting)
    return seen


async def test_manifest_of_a_real_run(run_copy: Path, hashed: list[str]) -> None:
    run = run_copy
    # Not artifacts: a lock, an atomic write's temp file.
    (run / "control.lock").write_bytes(b"")
    (run / ".progress.json.4242.tmp").write_bytes(b"{}")
    # A closed batch whose upload was never recorded: hashed on demand, not in S3.
    uploads = (run / "uploads.jsonl").read_text().splitlines()
    unrecorded = json.loads(uploads[3])["batch"]
    (run / "uploads.jsonl").write_text("\n".join(uploads[:3] + uploads[4:]) + "\n")
    # A closed batch changed after its upload (same size, later mtime): read again, not in S3.
    changed = run / "completions" / json.loads(uploads[1])["batch"]
    data = bytearray(changed.read_bytes())
    data[10] ^= 1
    changed.write_bytes(bytes(data))

    entries = await _pages(run, limit=3)
    paths = [e["path"] for e in entries]
    assert paths == sorted(paths) and len(paths) == len(set(paths)), "each file exactly once"
    assert set(paths) == _artifacts(run)
    by_path = {e["path"]: e for e in entries}
    batches = [e for e in entries if e["kind"] == "batch"]
    assert len(batches) == 8
    for e in entries:
        assert e["sha256"] == _sha(run / e["path"]), e["path"]
        assert e["size"] == (run / e["path"]).stat().st_size
        assert e["mtime_ns"] == (run / e["path"]).stat().st_mtime_ns
    reread = sorted([f"completions/{unrecorded}", f"completions/{changed.name}"])
    for e in batches:
        if e["path"] in reread:
            assert e["sha256_from"] == "read" and not e["in_s3"], e
        else:
            assert e["sha256_from"] == "uploads" and e["in_s3"], e
    # Closed batches are never read to hash them (their hash is in uploads.jsonl) ...
    assert sorted(p for p in hashed if p.startswith("completions/completions_")) == reread
    # ... everything else is, once.
    assert sorted(hashed) == sorted(p for p, e in by_path.items()
                                    if e["sha256_from"] != "uploads")
    kinds = {p: e["kind"] for p, e in by_path.items()}
    assert kinds["run.toml"] == kinds["progress.json"] == kinds["uploads.jsonl"] == "state"
    assert kinds["completions/.done_indices"] == "state"
    assert kinds["logs/generate.log"] == "log"
    assert (run / ".manifest_cache.json").is_file()

    # Again: nothing is read, everything comes from the cache or uploads.jsonl.
    hashed.clear()
    again = await _pages(run, limit=1000)
    assert hashed == [] and again == [{**e, "sha256_from": "cache"}
                                      if e["sha256_from"] == "read" else e for e in entries]

    # A file that grew and one touched (same size, new mtime) are read again; nothing else.
    with open(run / "logs" / "generate.log", "a") as f:
        f.write("one more line\n")
    st = (run / "run.pin.json").stat()
    os.utime(run / "run.pin.json", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    third = {e["path"]: e for e in await _pages(run, limit=1000)}
    assert sorted(hashed) == ["logs/generate.log", "run.pin.json"]
    assert third["logs/generate.log"]["sha256"] == _sha(run / "logs" / "generate.log")
    assert third["logs/generate.log"]["sha256"] != by_path["logs/generate.log"]["sha256"]

    # One prefix, and one path.
    comp = await _pages(run, limit=1000, prefix="completions")
    assert {e["path"] for e in comp} == {p for p in paths if p.startswith("completions/")}
    one = await ControlMethods(run).methods()["manifest"]({"path": "run.toml"})
    assert [e["path"] for e in one["entries"]] == ["run.toml"] and one["next_offset"] is None


async def test_symlinks_and_dotdot_are_refused_and_nothing_outside_is_read(
        run_copy: Path, tmp_path: Path, hashed: list[str]) -> None:
    run = run_copy
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    secret = b"SECRET-OUTSIDE-THE-RUN-DIR\n"
    (outside / "secret.txt").write_bytes(secret)
    (outside / "folder" / "inner-secret.txt").write_bytes(secret)
    (run / "logs" / "leak.log").symlink_to(outside / "secret.txt")
    (run / "linked").symlink_to(outside / "folder", target_is_directory=True)
    (run / "inside-link.json").symlink_to(run / "progress.json")  # even one pointing inside

    opened: list[str] = []

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event in ("open", "os.scandir", "os.listdir") and args and args[0] is not None:
            opened.append(os.fsdecode(args[0]) if isinstance(args[0], str | bytes)
                          else str(args[0]))

    sys.addaudithook(audit)  # process-wide and permanent; it only records
    methods = ControlMethods(run).methods()
    entries = await _pages(run, limit=7)
    during = list(opened)
    assert "history.jsonl" in during, "the audit hook sees what the manifest opens"

    refused = {e["path"]: e for e in entries if e["refused"]}
    assert set(refused) == {"logs/leak.log", "linked", "inside-link.json"}
    assert all(e["refused"] == "symlink" and e["sha256"] is None and e["size"] == 0
               for e in refused.values())
    assert not any(p.startswith("linked/") for p in (e["path"] for e in entries))
    assert not any(p in refused for p in hashed)
    text = json.dumps(entries)
    assert hashlib.sha256(secret).hexdigest() not in text and "inner-secret" not in text
    assert not [p for p in during if str(outside) in p or "leak.log" in p or "linked" in p]

    for params in ({"prefix": "../outside"}, {"path": "../../etc/passwd"},
                   {"path": "/etc/passwd"}, {"prefix": str(outside)},
                   {"path": "linked/inner-secret.txt"}, {"prefix": "logs/../../outside"}):
        with pytest.raises(RpcError) as err:
            await methods["manifest"](params)
        assert err.value.code == REFUSED, params
    # The symlink itself may be asked for: it is listed, refused, never read.
    page = await methods["manifest"]({"path": "logs/leak.log"})
    assert page["entries"][0]["refused"] == "symlink"


def test_manifest_listing_escapes_control_characters_in_names(tmp_path: Path) -> None:
    """`fleetdeck-agent manifest` prints names a node chose: an ESC in one must not reach the
    terminal (ESC [2J clears it, OSC sequences retitle or worse)."""
    import subprocess

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "a\x1b[2Jb\x07.log").write_bytes(b"x")
    r = subprocess.run([sys.executable, "-m", "agents.cli", "manifest", str(run_dir)],
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert b"\x1b" not in r.stdout and b"\x07" not in r.stdout
    assert b"logs/a\\x1b[2Jb\\x07.log" in r.stdout
