from pathlib import Path

import pytest

from core.config import default_config
from core.configfile import parse_config
from core.errors import ConfigError

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.*"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    cfg = parse_config(path.read_bytes(), str(path))
    assert cfg.sections()


@pytest.mark.parametrize(
    ("text", "source", "needles"),
    [
        ("union: {instances: -1}", "c.yaml", ["c.yaml", "union.instances", "greater than or equal to 0"]),
        ("union: {engine_type: tensorrt}", "c.yaml", ["union.engine_type", "'vllm', 'sglang' or 'builtin'"]),
        ("union: {}\ncontroler: {}", "c.yaml", ["controler", "Extra inputs are not permitted"]),
        (
            '{"union": {"health_check_config": {"startup_timeout": 0}}}',
            "c.json",
            ["union.health_check_config.startup_timeout"],
        ),
        ("{}", "c.yaml", ["at least one engine section"]),
        ("decode: {}", "c.yaml", ["decode section needs a prefill section"]),
        ("union: [1, 2", "c.yaml", ["c.yaml", "not valid YAML"]),
        ("{", "c.json", ["c.json", "not valid JSON"]),
        ("- 1", "c.yaml", ["top level must be a mapping"]),
        ("union: {engine_type: sglang, snapshot: {enabled: true}}", "c.yaml", ["vllm only"]),
        ("union: {engine_config: {nnodes: 2, data_parallel_size: 3}}", "c.yaml", ["not divisible by nnodes"]),
        (
            "union: {}\ncoordinator: {port: 70000}",
            "c.yaml",
            ["coordinator.port", "less than or equal to 65535"],
        ),
    ],
)
def test_bad_config_names_file_and_field(text: str, source: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, source)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, msg


def test_engine_helpers() -> None:
    cfg = parse_config(
        "union: {engine_config: {nnodes: 2, data-parallel-size: 4, disaggregation-bootstrap-port: 8998}}",
        "c.yaml",
    )
    sec = cfg.union
    assert sec is not None
    assert sec.nodes_per_instance() == 2
    assert sec.endpoints_per_node() == 2
    assert sec.bootstrap_port() == 8998


def test_default_is_union_plus_pair() -> None:
    cfg = default_config()
    assert {r.value: s.instances for r, s in cfg.sections().items()} == {
        "union": 1,
        "prefill": 1,
        "decode": 1,
    }
