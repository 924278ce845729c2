"""The layering: `core` imports no other package of ours; `httpcore` and `streams` only `core`;
components (controller, coordinator, nodeagent) never import each other. A `__main__.py` is
command-line glue (`python -m nodeagent.builtin` runs `motor engine builtin`) and may use deploy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"core", "streams", "httpcore", "controller", "coordinator", "nodeagent", "deploy"}
ALLOWED = {
    "core": set(),
    "streams": {"core"},
    "httpcore": {"core"},
    "controller": {"core", "streams", "httpcore"},
    "coordinator": {"core", "streams", "httpcore"},
    "nodeagent": {"core", "streams", "httpcore"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name == "__main__.py":
            continue
        wrong = _imports(path) - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, bad
