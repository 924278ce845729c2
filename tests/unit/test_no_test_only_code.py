"""No production function exists for the tests alone: a module-level function of a production
package that no production code names is either used by tests only (it moves into tests/, or
the tests use the production API it wraps) or by nobody (it goes).

"Names" is by identifier, anywhere in production: a call, an attribute, an import, or a word in
a string (a docstring, an entry point in pyproject.toml, a recipe in the justfile). That errs
towards passing: a function whose name some other code also uses (`command`) is not caught, but
nothing used is ever reported. Decorated functions are left out (a decorator such as
`@handles` registers them; nothing calls them by name), and so are methods: asyncio and
httptools call a protocol's `data_received` or `on_headers_complete` by name from outside our
code, and a name shared by many classes cannot say which one's method is unused.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit.test_import_rules import PRODUCTION, ROOT

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ALSO_PRODUCTION = ("pyproject.toml", "justfile")  # entry points and recipes name functions too


def names_used(source: str) -> set[str]:
    """Every identifier a module names, its strings' words included (a definition is not a use)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.add(node.name.rpartition(".")[2])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.update(WORD.findall(node.value))
    return out


def functions(source: str) -> list[tuple[str, int]]:
    """The undecorated module-level functions a module defines, with their lines."""
    return [
        (node.name, node.lineno)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.decorator_list
        and not node.name.startswith("__")
    ]


def unused_by_production(root: Path, packages: list[str]) -> dict[str, str]:
    """`path:line name` -> "tests only" or "nobody", for every production function no production
    code names."""
    defined: list[tuple[str, str]] = []
    used: set[str] = set()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            used |= names_used(source)
            defined += [(f"{path.relative_to(root)}:{line}", name) for name, line in functions(source)]
    for extra in ALSO_PRODUCTION:
        if (root / extra).exists():
            used |= set(WORD.findall((root / extra).read_text()))
    by_tests: set[str] = set()
    for path in sorted((root / "tests").rglob("*.py")):
        by_tests |= names_used(path.read_text())
    return {
        f"{where} {name}": "tests only" if name in by_tests else "nobody"
        for where, name in defined
        if name not in used
    }


def test_no_production_function_is_for_tests_alone() -> None:
    found = unused_by_production(ROOT, PRODUCTION)
    assert found == {}, (
        f"move into tests/ (or use the production API) what tests only use; remove the rest: {found}"
    )


def test_the_rule_catches_a_function_only_tests_call(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "def used():\n    return helper()\n\n"
        "def helper():\n    return 1\n\n"
        "def for_tests():\n    return 2\n\n"
        "def dead():\n    return 3\n\n"
        "def named_in_a_docstring():\n    '''see `used`'''\n\n"
        "@register\ndef handler():\n    return 4\n"
    )
    (pkg / "b.py").write_text("from pkg.a import used\n\nX = used\nY = 'pkg.a:named_in_a_docstring'\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("from pkg.a import for_tests\n")
    assert unused_by_production(tmp_path, ["pkg"]) == {
        "pkg/a.py:7 for_tests": "tests only",
        "pkg/a.py:10 dead": "nobody",
    }
