"""The operation log: every change the forgetting filesystem made, in order, to replay.

An `Op` is a Volume method's name and its arguments (inode numbers, names, offsets, bytes);
replaying ops[0:k] on a fresh Volume rebuilds the state after the k-th change. On disk a log is
`ops.jsonl` (one JSON list per op; written bytes as {"at": offset, "len": n} into `data.bin`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# What each kind's arguments are, in order (the Volume methods of the same names).
KINDS: dict[str, tuple[str, ...]] = {
    "create": ("parent", "name", "mode"),
    "mkdir": ("parent", "name", "mode"),
    "write": ("ino", "offset", "data"),
    "truncate": ("ino", "size"),
    "fsync": ("ino",),
    "fsyncdir": ("ino",),
    "rename": ("parent", "name", "new_parent", "new_name"),
    "unlink": ("parent", "name"),
    "rmdir": ("parent", "name"),
    "link": ("ino", "parent", "name"),
    "chmod": ("ino", "mode"),
    "power_loss": (),
}

Arg = int | str | bytes


@dataclass(frozen=True)
class Op:
    kind: str
    args: tuple[Arg, ...]

    def __str__(self) -> str:
        shown = [f"<{len(a)} bytes>" if isinstance(a, bytes) else repr(a) for a in self.args]
        return f"{self.kind}({', '.join(shown)})"


class LogError(ValueError):
    """A log file that is not a forgetfs operation log."""


def save(ops: Sequence[Op], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    at = 0
    with open(folder / "ops.jsonl", "w") as lines, open(folder / "data.bin", "wb") as blob:
        for op in ops:
            row: list[object] = [op.kind]
            for a in op.args:
                if isinstance(a, bytes):
                    blob.write(a)
                    row.append({"at": at, "len": len(a)})
                    at += len(a)
                else:
                    row.append(a)
            lines.write(json.dumps(row) + "\n")


def load(folder: Path) -> list[Op]:
    blob = (folder / "data.bin").read_bytes()
    ops = []
    path = folder / "ops.jsonl"
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            kind, raw = row[0], row[1:]
            if kind not in KINDS or len(raw) != len(KINDS[kind]):
                raise LogError(f"unknown op or wrong arity: {line[:200]}")
            args: list[Arg] = []
            for a in raw:
                if isinstance(a, dict):
                    args.append(blob[a["at"]:a["at"] + a["len"]])
                elif isinstance(a, int | str):
                    args.append(a)
                else:
                    raise LogError(f"argument {a!r} is not an int, a string or bytes")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LogError(f"{path}:{n}: {exc}") from exc
        ops.append(Op(kind, tuple(args)))
    return ops
