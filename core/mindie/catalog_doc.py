"""The field table of docs/mindie-config.md, rendered from the catalog (so the doc cannot drift).

`python -m core.mindie.catalog_doc` prints it; a test checks the doc holds exactly this text.
Engine blocks are shown once as `motor_engine_*_config` (prefill, decode and union share
their shape); `env.json` fields carry an `env.json:` prefix.
"""

from __future__ import annotations

from collections.abc import Iterator

from core.mindie.catalog import ENGINE_BLOCK, ENV_JSON, USER_CONFIG, Free, Map, Node, Unused

ENGINE = "motor_engine_*_config"


def _walk(tree: dict[str, Node], prefix: str) -> Iterator[tuple[str, Map | Unused | Free]]:
    for key, node in tree.items():
        path = f"{prefix}{key}"
        if isinstance(node, dict):
            yield from _walk(node, path + ".")
        else:
            yield path, node


def leaves() -> Iterator[tuple[str, Map | Unused | Free]]:
    """Every leaf of both files, engine blocks collapsed to one."""
    for key, node in USER_CONFIG.items():
        if node is ENGINE_BLOCK:
            continue
        if isinstance(node, dict):
            yield from _walk(node, key + ".")
        else:
            yield key, node
    yield from _walk(ENGINE_BLOCK, ENGINE + ".")
    yield from _walk(ENV_JSON, "env.json:")


def render_table() -> str:
    """The markdown table: JSON path, then the Motor field or why it is not used."""
    rows = ["| MindIE-Motor field | Motor |", "|---|---|"]
    for path, node in leaves():
        if isinstance(node, Unused) or (isinstance(node, Free) and node.target is None):
            motor = f"not used: {node.reason}"
        else:
            motor = f"`{node.target}`"
        suffix = ".*" if isinstance(node, Free) else ""
        rows.append(f"| `{path}{suffix}` | {motor} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
