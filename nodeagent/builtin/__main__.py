"""`python -m nodeagent.builtin ARGS` is `motor engine builtin ARGS`."""

from __future__ import annotations

import sys

from deploy.cli import main

if __name__ == "__main__":
    sys.exit(main(["engine", "builtin", *sys.argv[1:]]))
