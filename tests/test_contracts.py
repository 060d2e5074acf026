"""Import contracts between the parts (docs/architecture.md, "the direction of dependencies"):
the agent stays light and never imports the console; the headless console never imports
Textual; the trainer never imports the console; widgets never reach the transport; and no
two modules import each other at run time; no script run by its path shadows a standard
module. Checked in fresh interpreters (what really gets imported) and over the source with
`ast` (every import statement, even one inside a function, and the graph of module-level
imports)."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("agents", "console", "trainer")
# Folders whose files run as `python FOLDER/X.py`: that folder comes first on sys.path, so a
# file there named like a standard module (queue.py) replaces it for every script there.
SCRIPT_FOLDERS = ("benchmarks", "scripts")

# -- the source, read with ast ----------------------------------------------------------------


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the packages under root: dotted name -> file."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            out[module_name(root, path)] = path
    return out


@dataclass(frozen=True, slots=True)
class Import:
    target: str  # the module imported, absolute
    line: int
    top_level: bool  # runs when the module is imported (not in a function, not TYPE_CHECKING)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: set[str]) -> list[Import]:
    """Every import statement of a module, resolved to the module it loads: `from a.b import c`
    is a.b.c when that is a module of ours, else a.b."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        return ".".join([*base, *([node.module] if node.module else [])])

    def visit(body: list[ast.stmt], top: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                found.extend(Import(a.name, stmt.lineno, top) for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                base = resolve(stmt)
                for a in stmt.names:
                    sub = f"{base}.{a.name}"
                    found.append(Import(sub if sub in known else base, stmt.lineno, top))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(stmt.body, False)
            elif isinstance(stmt, ast.If):
                visit(stmt.body, top and not _is_type_checking(stmt.test))
                visit(stmt.orelse, top)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    for child in getattr(stmt, field, []) or []:
                        visit(child.body if isinstance(child, (ast.ExceptHandler,
                              ast.match_case)) else [child], top)

    visit(tree.body, True)
    return found


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, dict[str, int]]:
    """Module -> {module of ours it imports when it is imported: line}."""
    mods = modules(root, packages)
    known = set(mods)
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        for imp in imports(name, path, known):
            if imp.top_level and imp.target in known and imp.target != name:
                edges.setdefault(imp.target, imp.line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One chain per strongly connected group of modules (Tarjan), e.g. [a, b, a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_chain(graph, set(g)) for g in groups]


def _chain(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A closed path through a strongly connected group, from its first module."""
    start = min(group)
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in group)
        back = [w for w in nxt if w in seen]
        if back:
            return [*path[path.index(back[0]):], back[0]]
        path.append(nxt[0])
        seen.add(nxt[0])


def describe(graph: dict[str, dict[str, int]], chain: list[str]) -> str:
    steps = (f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(chain))
    return " -> ".join(steps) + f" -> {chain[-1]}"


def forbidden_imports(root: Path, package: str, banned: tuple[str, ...]) -> list[str]:
    """Every import statement anywhere in package (functions included) of a banned root."""
    mods = modules(root, [package])
    bad = []
    for name, path in mods.items():
        for imp in imports(name, path, set(mods)):
            if any(imp.target == b or imp.target.startswith(b + ".") for b in banned):
                bad.append(f"{path.relative_to(root)}:{imp.line} imports {imp.target}")
    return bad


# -- what really gets imported, in a fresh interpreter ------------------------------------------

PROBE = textwrap.dedent("""
    import importlib, json, sys
    for name in sys.argv[1:]:
        importlib.import_module(name)
    print(json.dumps(sorted(sys.modules)))
""")


def loaded_by(*names: str) -> set[str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True,
                       cwd=ROOT, timeout=180)
    assert r.returncode == 0, f"importing {names} failed:\n{r.stderr}"
    return set(json.loads(r.stdout))


def under(loaded: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in roots)


# -- the contracts ------------------------------------------------------------------------------

AGENT_BANNED = ("textual", "asyncssh", "torch", "console")
HEADLESS_ENTRY_POINTS = ("console.cli", "console.headless", "console.transport",
                         "console.bootstrap", "console.fleet", "console.state")


def headless_modules() -> list[str]:
    """Every console module outside console/tui (the only door into Textual)."""
    return sorted(m for m in modules(ROOT, ["console"]) if m != "console.tui"
                  and not m.startswith("console.tui.") and not m.endswith(".__main__"))


def test_the_agent_never_imports_textual_asyncssh_torch_or_the_console() -> None:
    assert forbidden_imports(ROOT, "agents", AGENT_BANNED) == []
    agent = sorted(m for m in modules(ROOT, ["agents"]) if not m.endswith(".__main__"))
    loaded = loaded_by(*agent)
    assert under(loaded, AGENT_BANNED) == [], "importing every agents module loads them"


@pytest.mark.parametrize("entry", headless_modules())
def test_the_headless_console_never_imports_textual(entry: str) -> None:
    loaded = loaded_by(entry)
    assert entry in loaded
    assert under(loaded, ("textual",)) == [], f"importing {entry} loads Textual"


def test_the_headless_entry_points_are_all_checked() -> None:
    checked = set(headless_modules())
    assert set(HEADLESS_ENTRY_POINTS) <= checked
    assert {m for m in checked if m.startswith("console.artifacts.")}


def test_the_trainer_never_imports_the_console() -> None:
    assert forbidden_imports(ROOT, "trainer", ("console",)) == []


def test_widgets_never_reach_the_transport() -> None:
    graph = import_graph(ROOT, PARTS)
    mods = modules(ROOT, ["console"])
    widgets = [m for m in mods if m.startswith("console.tui.widgets.")]
    assert widgets
    for w in widgets:
        direct = [i for i in imports(w, mods[w], set(mods)) if i.target == "console.transport"]
        assert not direct, f"{mods[w]}:{direct[0].line} imports console.transport"
        assert "console.transport" not in reachable(graph, w), \
            f"{w} imports console.transport through its imports"


def reachable(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), {}):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_no_import_cycle_at_run_time() -> None:
    graph = import_graph(ROOT, PARTS)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


# -- the checks themselves can fail --------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "import os\nfrom .c import thing\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nfrom pkg.a import x\n",
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import e\n"
                    "def f():\n    from pkg import e\n",
        "pkg/e.py": "from pkg import d\n",
    })
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.b"] == {"pkg.c": 2}
    assert graph["pkg.d"] == {}  # TYPE_CHECKING and function-level imports do not run
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe(graph, found[0]) == \
        "pkg.a (line 1) -> pkg.b (line 2) -> pkg.c (line 2) -> pkg.a"


def test_a_banned_import_is_found_even_inside_a_function(tmp_path: Path) -> None:
    write_tree(tmp_path, {"agents/__init__.py": "",
                          "agents/x.py": "def f():\n    import textual.app\n"})
    assert forbidden_imports(tmp_path, "agents", AGENT_BANNED) == \
        ["agents/x.py:2 imports textual.app"]


def test_the_fresh_interpreter_probe_sees_what_is_loaded() -> None:
    assert "console.tui.app" in loaded_by("console.tui.app")
    assert under(loaded_by("console.tui.app"), ("textual",))


def test_no_script_shadows_a_standard_module() -> None:
    clash = [f"{folder}/{path.name}" for folder in SCRIPT_FOLDERS
             for path in sorted((ROOT / folder).glob("*.py"))
             if path.stem in sys.stdlib_module_names]
    assert clash == [], (f"{clash}: run by path, each replaces the standard module of its name "
                         "for every script in its folder (urllib3 imports queue): rename it")
