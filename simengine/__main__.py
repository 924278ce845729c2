"""`python -m simengine ARGS`: run one builtin engine process (`simengine/cli.py`)."""

from __future__ import annotations

import sys

from simengine.cli import main

if __name__ == "__main__":
    sys.exit(main())
