"""The tiny-model builder: reproducible, loadable shapes, a working tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from deploy.cli import main as motor
from deploy.tinymodel import (
    BOS,
    EOS,
    FILES,
    IM_END,
    TinyLlamaSpec,
    TinyModelError,
    build_tiny_llama,
    digest,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "m")


def test_same_seed_gives_identical_files(tiny: Path, tmp_path: Path) -> None:
    again = build_tiny_llama(tmp_path / "again")
    assert digest(again) == digest(tiny)


def test_other_seed_changes_only_the_weights(tiny: Path, tmp_path: Path) -> None:
    other = build_tiny_llama(tmp_path / "other", TinyLlamaSpec(seed=1))
    assert (other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()


def test_writes_every_file_of_a_hf_llama(tiny: Path) -> None:
    assert sorted(p.name for p in tiny.iterdir()) == sorted(FILES)


def test_weight_shapes_match_config(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    w = load_file(str(tiny / "model.safetensors"))
    h, v, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    assert (h, cfg["num_attention_heads"], hd, cfg["num_hidden_layers"]) == (128, 4, 32, 2)
    assert w["model.embed_tokens.weight"].shape == (v, h)
    assert w["lm_head.weight"].shape == (v, h)
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (cfg["num_key_value_heads"] * hd, h)
    assert w["model.layers.0.mlp.down_proj.weight"].shape == (h, cfg["intermediate_size"])
    assert len(w) == 2 + 1 + 9 * cfg["num_hidden_layers"]
    assert {str(a.dtype) for a in w.values()} == {"float32"}


def test_vocab_is_exactly_the_tokenizers(tiny: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert cfg["vocab_size"] == tok.get_vocab_size()
    assert cfg["bos_token_id"] == tok.token_to_id(BOS)
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.token_to_id(EOS), tok.token_to_id(IM_END)]


@pytest.mark.parametrize(
    "text",
    ["Hello, how are you?", "def add(a, b):\n    return a + b", "naïve café 東京 🚀", "  two  spaces "],
)
def test_tokenizer_round_trips_any_text(tiny: Path, text: str) -> None:
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert tok.decode(tok.encode(text).ids) == text


def test_chat_template_renders_chatml(tiny: Path) -> None:
    cfg = json.loads((tiny / "tokenizer_config.json").read_text())
    out = jinja2.Template(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (TinyLlamaSpec(hidden_size=96, num_attention_heads=4), "head_dim 24"),
        (TinyLlamaSpec(hidden_size=130, num_attention_heads=4), "divisible by num_attention_heads"),
        (TinyLlamaSpec(num_key_value_heads=3), "divisible by num_key_value_heads"),
    ],
)
def test_bad_shape_is_refused_with_the_reason(spec: TinyLlamaSpec, message: str, tmp_path: Path) -> None:
    with pytest.raises(TinyModelError, match=message):
        build_tiny_llama(tmp_path / "m", spec)


def test_cli_refuses_a_non_empty_dir_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("x")
    assert motor(["model", "tiny", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert motor(["model", "tiny", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "model.safetensors").exists()


def test_cli_names_the_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert motor(["model", "tiny", str(tmp_path / "m"), "--vocab-size", "10"]) == 2
    assert "--vocab-size" in capsys.readouterr().err
