"""A real, small filesystem for full-disk tests: a tmpfs mounted by the test (root only), grown
later by a remount ("space freed"). Tests skip with the errno when mounting is not allowed."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MS_REMOUNT = 32
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount(target: Path, options: str, flags: int = 0) -> int:
    """0, or the errno of mount(2)."""
    rc = _libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode())
    return 0 if rc == 0 else ctypes.get_errno()


@contextmanager
def small_tmpfs(target: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (`64k`) at `target`, unmounted afterwards; skips the test when the
    kernel refuses the mount (not root, no CAP_SYS_ADMIN, a container that forbids it)."""
    target.mkdir(parents=True, exist_ok=True)
    err = _mount(target, f"size={size},mode=0755")
    if err:
        pytest.skip(f"cannot mount a tmpfs at {target}: errno {err} "
                    f"({os.strerror(err)}); the full-disk test needs root")
    try:
        yield target
    finally:
        _libc.umount2(os.fsencode(target), MNT_DETACH)


def grow(target: Path, size: str) -> None:
    """Free space: remount the tmpfs with a larger size (the files stay)."""
    err = _mount(target, f"size={size}", MS_REMOUNT)
    assert err == 0, f"remount {target} size={size}: errno {err} ({os.strerror(err)})"
