"""The layering, as data: which of our packages each package may import (walked with `ast`,
imports inside functions included; no file is exempt).

- `core` imports nothing of ours; the shared leaves `streams` (JetStream) and `http1` (the
  HTTP/1.1 server core) only `core`.
- Components never import each other: `controller`, `coordinator`, `nodeagent` import only
  `core`, `streams` and `http1`; the builtin engine `simengine` only `core` and `http1` (it
  never touches the log).
- `replay` (explain, timeline, verify: analysis of the log) only `core` and `streams`.
- `deploy` (the `motor` CLI, the composition root) may import anything; nothing imports
  `deploy` but `deploy` and the tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEAVES = {"core", "streams", "http1"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "streams": {"core"},
    "http1": {"core"},
    "controller": {"core", "streams", "http1"},
    "coordinator": {"core", "streams", "http1"},
    "nodeagent": {"core", "streams", "http1"},
    "simengine": {"core", "http1"},
    "replay": {"core", "streams"},
}
ANYTHING = {"deploy", "tests"}  # the composition root and the tests see every package


def _ours() -> set[str]:
    return {p.parent.name for p in ROOT.glob("*/__init__.py")}


def _imports(path: Path, ours: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & ours


def _arrows(package: str, ours: set[str]) -> dict[str, set[str]]:
    """file -> the other packages of ours it imports."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        imported = _imports(path, ours) - {package}
        if imported:
            found[str(path.relative_to(ROOT))] = imported
    return found


def test_every_package_has_a_rule() -> None:
    assert _ours() == set(ALLOWED) | ANYTHING


def test_components_see_only_the_shared_leaves() -> None:
    for package, allowed in ALLOWED.items():
        assert allowed <= LEAVES, package
        assert package not in LEAVES or allowed <= {"core"}, package


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    ours = _ours()
    bad = {f: sorted(got - ALLOWED[package]) for f, got in _arrows(package, ours).items()}
    bad = {f: got for f, got in bad.items() if got}
    assert not bad, bad


def test_the_rule_catches_a_forbidden_arrow(tmp_path: Path) -> None:
    """The walk sees a lazy import inside a function, the way `__main__` glue once imported deploy."""
    src = tmp_path / "glue.py"
    src.write_text("def main():\n    from deploy.cli import main\n    import coordinator.proxy\n")
    assert _imports(src, _ours()) == {"deploy", "coordinator"}


# --------------------------------------------------------------------------- modules

PRODUCTION = sorted(set(ALLOWED) | {"deploy"})
MAX_LINES = 400


@pytest.mark.parametrize("package", PRODUCTION)
def test_no_two_modules_import_each_other(package: str) -> None:
    """No import circle between modules, however hidden: an import inside a function or under
    `TYPE_CHECKING` counts like any other (the circles once hidden that way are gone)."""
    from tests.unit.test_coord_imports import circles, graph

    assert circles(graph(ROOT, package)) == []


def test_no_circle_crosses_packages() -> None:
    """The same over the modules of every production package at once."""
    from tests.unit.test_coord_imports import circles, graph

    edges: dict[str, set[str]] = {}
    for package in PRODUCTION:
        for name, targets in graph(ROOT, package).items():
            edges.setdefault(name, set()).update(targets)
    # Arrows into other packages: `graph` resolves within one package, so add the others'.
    names = set(edges)
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                targets: list[str] = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                for t in targets:
                    while t and t not in names:
                        t = t.rpartition(".")[0]
                    if t and t != name:
                        edges[name].add(t)
    assert circles(edges) == []


def test_no_module_is_over_400_lines() -> None:
    over = {}
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                over[rel] = n
    assert over == {}, f"split these (at most {MAX_LINES} lines a module): {over}"


def test_the_circle_rule_sees_a_function_level_import(tmp_path: Path) -> None:
    from tests.unit.test_coord_imports import circles, graph

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("def x():\n    from pkg.a import y\n")
    assert circles(graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b"]]
