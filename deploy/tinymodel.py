"""A tiny random-weight Llama with a locally trained tokenizer, for running real engines here.

No weights can be downloaded on these machines, so the real-engine tests build their own
model: a Hugging Face-layout directory (config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json with a chat template) that
`vllm serve DIR` loads like any Llama. The text it writes is noise; what matters is that
the engine runs the real code paths (load, scheduling, KV cache, P/D transfer) and that
greedy decoding is deterministic. Built with numpy + safetensors + tokenizers (the `vllm`
extra), no torch. Seeded: the same arguments give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, IM_START, IM_END, PAD]

# ChatML: the assistant turn ends with <|im_end|>, which generation_config lists as a stop id.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

# A small built-in corpus: enough English and code-ish text for a few hundred BPE merges.
_CORPUS = """
The controller folds every event into the cluster state and decides what to do next.
A node agent registers its node, launches engine processes and reports their health.
The coordinator serves the OpenAI API and routes each request to a healthy instance.
Prefill computes the key and value cache of the prompt; decode generates one token at a time.
When a prefill instance finishes, the decode instance pulls the cache and continues the answer.
Heartbeats carry the load of each endpoint: available slots, available blocks, running, waiting.
If an engine dies, the node agent reports it dead at once and the controller restarts it.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris.
Tell me a story about a small robot who learned to count the stars in the night sky.
Once upon a time there was a tiny model that lived on a computer with two cores.
It could not say anything useful, but it answered every question quickly and politely.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May
red orange yellow green blue indigo violet black white grey brown pink purple gold silver
"""


@dataclass(frozen=True, slots=True)
class TinyLlamaSpec:
    """Shape of the model; head_dim = hidden / heads must be one CPU attention supports (32, 64, 80 …)."""

    hidden_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    num_hidden_layers: int = 2
    intermediate_size: int = 256
    vocab_size: int = 1024
    max_position_embeddings: int = 2048
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class TinyModelError(RuntimeError):
    """The model cannot be built (missing dependency, bad shape, target not empty)."""


def _require() -> tuple[Any, Any, Any]:
    try:
        import numpy
        import safetensors.numpy
        import tokenizers
    except ImportError as exc:
        raise TinyModelError(
            f"building the tiny model needs numpy, safetensors and tokenizers ({exc.name} is missing): "
            "pip install -e '.[vllm]'"
        ) from None
    return numpy, safetensors.numpy, tokenizers


def _check_spec(spec: TinyLlamaSpec) -> None:
    if spec.hidden_size % spec.num_attention_heads:
        raise TinyModelError("hidden_size must be divisible by num_attention_heads")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise TinyModelError("num_attention_heads must be divisible by num_key_value_heads")
    if spec.head_dim not in (32, 64, 80, 96, 112, 128, 192, 256):
        raise TinyModelError(f"head_dim {spec.head_dim} is not supported by vLLM's CPU attention")


def train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on the built-in corpus (deterministic)."""
    _, _, tk = _require()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    tok.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.strip().splitlines() * 4, trainer=trainer)
    return tok


def _weights(spec: TinyLlamaSpec, vocab: int) -> dict[str, Any]:
    np, _, _ = _require()
    rng = np.random.default_rng(spec.seed)
    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    kv = spec.num_key_value_heads * hd

    def normal(*shape: int, std: float = 0.02) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Embeddings a little louder than the rest so the random logits are not flat and greedy
    # decoding walks through varied tokens instead of repeating one.
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, h, std=1.0)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        tensors[p + "self_attn.q_proj.weight"] = normal(h, h)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv, h)
        tensors[p + "self_attn.o_proj.weight"] = normal(h, h)
        tensors[p + "mlp.gate_proj.weight"] = normal(inter, h)
        tensors[p + "mlp.up_proj.weight"] = normal(inter, h)
        tensors[p + "mlp.down_proj.weight"] = normal(h, inter)
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float32)
    tensors["lm_head.weight"] = normal(vocab, h, std=0.5)
    return tensors


def _config(spec: TinyLlamaSpec, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "num_hidden_layers": spec.num_hidden_layers,
        "head_dim": spec.head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "initializer_range": 0.02,
    }


def _dump_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_tiny_llama(out_dir: Path, spec: TinyLlamaSpec | None = None, *, force: bool = False) -> Path:
    """Write the model files into `out_dir` (created); refuses a non-empty dir unless `force`."""
    spec = spec or TinyLlamaSpec()
    _check_spec(spec)
    _, st, _ = _require()
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise TinyModelError(f"{out_dir} is not empty (pass --force to overwrite)")
    out_dir.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(spec.vocab_size)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    # The model's vocab is exactly the tokenizer's, so every id it can emit decodes.
    vocab = tok.get_vocab_size()
    tok.save(str(out_dir / "tokenizer.json"))
    _dump_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "additional_special_tokens": [IM_START, IM_END],
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": spec.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _dump_json(out_dir / "config.json", _config(spec, vocab, ids))
    _dump_json(
        out_dir / "generation_config.json",
        {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids[IM_END]], "pad_token_id": ids[PAD]},
    )
    st.save_file(_weights(spec, vocab), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def digest(model_dir: Path) -> str:
    """SHA-256 over the model's files, to check that a build is reproducible."""
    h = hashlib.sha256()
    for name in FILES:
        h.update(name.encode())
        h.update((Path(model_dir) / name).read_bytes())
    return h.hexdigest()
