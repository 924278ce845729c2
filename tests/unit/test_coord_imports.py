"""The coordinator's modules form no import circle, and none is hidden: every import counts
(module level, under `TYPE_CHECKING`, inside a function), no module imports inside a function
at all, and no module is longer than 400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` under `root`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (a `from p import name` naming a
    submodule counts as importing it; a package's `__init__` is a module like any other)."""
    mods = modules(root, package)
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.add(t)
        edges[name] = found
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def imports_in_functions(path: Path) -> list[int]:
    """Line numbers of imports inside a function body."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    lines.append(inner.lineno)
    return sorted(lines)


def test_no_import_circle_in_the_coordinator() -> None:
    assert circles(graph(ROOT, "coordinator")) == []


def test_no_coordinator_module_imports_inside_a_function() -> None:
    found = {str(p.relative_to(ROOT)): imports_in_functions(p) for p in modules(ROOT, "coordinator").values()}
    assert {f: lines for f, lines in found.items() if lines} == {}


def test_no_coordinator_module_is_over_400_lines() -> None:
    lengths = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for p in modules(ROOT, "coordinator").values()
    }
    assert {f: n for f, n in lengths.items() if n > MAX_LINES} == {}


def test_the_walk_finds_a_circle_hidden_under_type_checking_and_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert circles(graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]
    assert imports_in_functions(pkg / "b.py") == [2]
    assert imports_in_functions(pkg / "a.py") == []
