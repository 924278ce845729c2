import pytest

from nodeagent.flags import flag_name, merge_options, option_key, to_flags


@pytest.mark.parametrize(
    ("options", "argv"),
    [
        ({"max_model_len": 4096}, ["--max-model-len", "4096"]),
        ({"max-model-len": 4096}, ["--max-model-len", "4096"]),
        ({"enforce_eager": True}, ["--enforce-eager"]),
        ({"enforce_eager": False}, []),
        ({"quantization": None}, []),
        (
            {"kv_transfer_config": {"kv_role": "kv_both", "kv_connector": "NixlConnector"}},
            ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'],
        ),
        ({"served_model_name": ["a", "b"]}, ["--served-model-name", "a", "b"]),
        ({"allowed_origins": []}, []),
        ({"gpu_memory_utilization": 0.9}, ["--gpu-memory-utilization", "0.9"]),
        ({"a": 1, "b": None, "c": True}, ["--a", "1", "--c"]),
    ],
)
def test_to_flags_rules(options: dict[str, object], argv: list[str]) -> None:
    assert to_flags(options) == argv


def test_names() -> None:
    assert flag_name("data_parallel_size") == "--data-parallel-size"
    assert option_key("--data-parallel-size") == "data_parallel_size"


def test_merge_later_layer_wins_and_keeps_first_position() -> None:
    merged = merge_options({"port": 1, "host": "a"}, {"max-model-len": 5, "port": 2}, {"max_model_len": 7})
    assert list(merged.items()) == [("port", 2), ("host", "a"), ("max-model-len", 7)]


def test_merge_drop_by_any_spelling() -> None:
    assert merge_options({"data-parallel-size-local": 2, "x": 1}, drop=("data_parallel_size_local",)) == {
        "x": 1
    }
