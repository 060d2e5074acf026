"""The goldens recorded from a real SGLang server (tests/fixtures/sglang/real-0.5.23/, written
by scripts/record_sglang_goldens.py), and the shape comparison the simulator's fidelity tests
and the recorder's smoke test make with them: keys, types and nesting, never volatile values
(ids, timestamps, latencies, ports, paths)."""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "sglang" / "real-0.5.23"


@cache
def manifest(folder: Path = REAL) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    return data


def load(rel: str, folder: Path = REAL) -> Any:
    path = folder / rel
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def shape(value: Any) -> Any:
    """A value's structure: objects by key, lists by the union of their items, scalars by
    type (`int`, `float`, `str`, `bool`, `null`)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            merged = _merge(merged, shape(item))
        return [merged] if value else []
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def _merge(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a.get(k), b.get(k)) for k in {**a, **b}}
    return a if a == b else f"{a}|{b}" if isinstance(a, str) and isinstance(b, str) else "mixed"


def differences(real: Any, sim: Any, nullable: frozenset[str] = frozenset(),
                path: str = "$") -> list[str]:
    """Where the simulator's shape differs from the real one: a key one has and the other
    lacks, another type, other nesting. Keys named in `nullable` may be null in one and a
    value in the other (SGLang fills them by content: cached tokens, a reasoning parser)."""
    out: list[str] = []
    if isinstance(real, dict) and isinstance(sim, dict):
        for key in sorted(set(real) | set(sim)):
            if key not in sim:
                out.append(f"{path}.{key}: the real answer has it, the simulator's lacks it")
            elif key not in real:
                out.append(f"{path}.{key}: the simulator's answer has it, the real one lacks it")
            else:
                out += differences(real[key], sim[key], nullable, f"{path}.{key}")
    elif isinstance(real, list) and isinstance(sim, list):
        if real and sim:
            out += differences(real[0], sim[0], nullable, f"{path}[]")
    elif real != sim:
        leaf = path.rsplit(".", 1)[-1].removesuffix("[]")
        if not (leaf in nullable and "null" in (real, sim)):
            out.append(f"{path}: real {real!r}, simulator {sim!r}")
    return out


def families(text: str) -> dict[str, tuple[str, frozenset[str], str]]:
    """Each sample name of an exposition (with `sglang:`): its family's type, the label keys
    of its samples (`le` aside) and its HELP text."""
    out: dict[str, tuple[str, frozenset[str], str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_count", "_sum")) and fam.type == "histogram":
                name = fam.name
            else:
                name = s.name
            labels = frozenset(s.labels) - {"le"}
            kind, seen, doc = out.get(name, (fam.type, frozenset(), fam.documentation))
            out[name] = (kind, seen | labels, doc)
    return out


# Where the product reads SGLang's /metrics and /server_info: sglang_metrics.py, and any
# other module of the supervisor that names a `sglang:` metric (the log reader, whose field
# names look like metric names, aside).
READERS = "agents/supervise"
NOT_READERS = ("sglang_log.py",)


@cache
def product_strings() -> frozenset[str]:
    """Every string constant in the product's SGLang readers: what it may look up in
    /metrics and /server_info."""
    found: set[str] = set()
    for path in sorted((REPO / READERS).glob("*.py")):
        text = path.read_text()
        if path.name in NOT_READERS or (path.name != "sglang_metrics.py"
                                        and "sglang:" not in text):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return frozenset(found)


def read_by_product(names: set[str], prefix: str = "") -> set[str]:
    """The names (`prefix` taken off) that the product's readers spell out."""
    strings = product_strings()
    return {n for n in names if n.removeprefix(prefix) in strings}


def sse_events(text: str) -> list[Any]:
    """The JSON events of an SSE body that ends with `data: [DONE]`."""
    events = [e.removeprefix("data: ") for e in text.strip().split("\n\n")]
    assert events[-1] == "[DONE]", events[-1][:80]
    return [json.loads(e) for e in events[:-1]]


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def template(line: str) -> str:
    """A log line's words with every number as `N` and its `[time]` prefix cut."""
    return NUMBER.sub("N", re.sub(r"^\[[^\]]*\] ", "", line.strip()))
