"""`motor model tiny DIR`: build a tiny random-weight Llama that real engines can serve here."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("model", help="build local test models (no downloads)")
    msub = p.add_subparsers(dest="model_cmd", metavar="ACTION", required=True)
    tiny = msub.add_parser(
        "tiny",
        help="a random-weight Llama (hidden 128, 4 heads, 2 layers) with a locally trained tokenizer",
    )
    tiny.add_argument("dir", type=Path, help="output directory (created)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    tiny.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary target (default 1024)")
    tiny.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    tiny.add_argument("--force", action="store_true", help="overwrite a non-empty directory")
    tiny.set_defaults(func=_tiny)


def _tiny(args: argparse.Namespace) -> int:
    from deploy.tinymodel import TinyLlamaSpec, TinyModelError, build_tiny_llama, digest

    if args.vocab_size < 300:
        print("motor model tiny: --vocab-size must be >= 300 (256 bytes + special tokens)", file=sys.stderr)
        return 2
    if args.layers < 1:
        print("motor model tiny: --layers must be >= 1", file=sys.stderr)
        return 2
    spec = TinyLlamaSpec(seed=args.seed, vocab_size=args.vocab_size, num_hidden_layers=args.layers)
    t0 = time.monotonic()
    try:
        out = build_tiny_llama(args.dir, spec, force=args.force)
    except TinyModelError as exc:
        print(f"motor model tiny: {exc}", file=sys.stderr)
        return 2
    print(f"{out}: tiny llama built in {time.monotonic() - t0:.2f}s (sha256 {digest(out)[:16]})")
    return 0
