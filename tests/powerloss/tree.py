"""A folder's names and contents as a value, to compare a live mount with a crash state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tree:
    files: dict[str, bytes]  # relative path -> content
    dirs: frozenset[str]
    links: frozenset[frozenset[str]]  # the names of one file, for files with two or more

    def diff(self, other: Tree) -> list[str]:
        """What differs, one line each (empty when the trees are equal)."""
        out = [f"directory only in the first: {d}" for d in sorted(self.dirs - other.dirs)]
        out += [f"directory only in the second: {d}" for d in sorted(other.dirs - self.dirs)]
        for name in sorted(self.files.keys() | other.files.keys()):
            a, b = self.files.get(name), other.files.get(name)
            if a is None:
                out.append(f"file only in the second: {name} ({len(b or b'')} bytes)")
            elif b is None:
                out.append(f"file only in the first: {name} ({len(a)} bytes)")
            elif a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                          min(len(a), len(b)))
                out.append(f"{name}: {len(a)} bytes vs {len(b)}, first difference at {at}")
        if self.links != other.links:
            out.append(f"hard links differ: {sorted(map(sorted, self.links))} vs "
                       f"{sorted(map(sorted, other.links))}")
        return out


def read_tree(root: Path) -> Tree:
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    names: dict[tuple[int, int], set[str]] = {}
    for here, subdirs, filenames in os.walk(root):
        rel = os.path.relpath(here, root)
        prefix = "" if rel == "." else rel + "/"
        dirs.update(prefix + d for d in subdirs)
        for f in filenames:
            path = os.path.join(here, f)
            st = os.lstat(path)
            with open(path, "rb") as fh:
                files[prefix + f] = fh.read()
            names.setdefault((st.st_dev, st.st_ino), set()).add(prefix + f)
    links = frozenset(frozenset(n) for n in names.values() if len(n) > 1)
    return Tree(files, frozenset(dirs), links)
