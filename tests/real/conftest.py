"""Fixtures for the real-engine tests: the vLLM venv, the tiny model (built once), phase timings.

Run by `just test-vllm` (which installs `.venv-vllm/` first). Each phase starts its engines,
checks them and stops them before the next, so at most two ~2.7 GB engines run at a time on
the 2-core machine. The time each phase took is printed at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deploy.tinymodel import build_tiny_llama
from tests.real.vllm_proc import VLLM_PYTHON

# Long enough (> 2 blocks of 32 tokens) that a KV connector moves whole blocks.
PD_PROMPTS = (
    "The controller folds every event into the cluster state and decides what to do next. "
    "A node agent registers its node, launches engine processes and reports their health. "
    "The coordinator serves the OpenAI API and routes each request to a healthy instance. Then",
    "Once upon a time there was a tiny model that lived on a computer with two cores. "
    "It could not say anything useful, but it answered every question quickly and politely. "
    "Tell me a story about a small robot who learned to count the stars in the night sky.",
)
MAX_TOKENS = 16
# Past the coordinator's continue_whole_from_tokens (32): a whole answer takes the folded path.
LONG = 40


class Timings:
    """Named durations collected during the session, printed in the terminal summary."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float]] = []

    def add(self, name: str, seconds: float) -> None:
        self.items.append((name, seconds))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - t0)


_TIMINGS = Timings()


# The union phase records the greedy reference answers the P/D phases compare against; run
# it first so they need no extra engine of their own.
_MODULE_ORDER = ("test_vllm_union", "test_vllm_pd")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        return _MODULE_ORDER.index(name) if name in _MODULE_ORDER else len(_MODULE_ORDER)

    items.sort(key=rank)  # stable: file order within a module is kept


@pytest.fixture(scope="session")
def timings() -> Timings:
    return _TIMINGS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TIMINGS.items:
        return
    terminalreporter.section("real vLLM timings")
    for name, seconds in _TIMINGS.items:
        terminalreporter.write_line(f"{seconds:8.1f}s  {name}")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's interpreter; a clear failure when `just setup-vllm` has not run."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `just setup-vllm` (or `just test-vllm`)")
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Path:
    """The tiny random-weight Llama, built once per session into a temp dir."""
    with _TIMINGS.phase("build tiny model"):
        return build_tiny_llama(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="session")
def reference() -> dict[str, str]:
    """Greedy union answers to PD_PROMPTS, filled by the first test that serves a union engine."""
    return {}
