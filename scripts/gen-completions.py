#!/usr/bin/env python3
"""Write the shell completion scripts for gpumemctl from the live typer/click app.

    python scripts/gen-completions.py [OUTDIR]      (default: completions/ beside scripts/)

Writes OUTDIR/bash/gpumemctl, OUTDIR/zsh/_gpumemctl and OUTDIR/fish/gpumemctl.fish (the
names each shell looks for in its completion directory). The scripts are click's; what they
complete is answered at TAB time by gpumemctl itself (gpumemctl/cli/completion.py).
tests/ops/test_generated.py regenerates into a temporary directory and fails on any
difference from what is committed.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpumemctl.cli.completion import SCRIPT_NAMES, script  # noqa: E402


def main(argv: list[str]) -> int:
    outdir = argv[1] if len(argv) > 1 else os.path.join(ROOT, "completions")
    for shell, name in SCRIPT_NAMES.items():
        path = os.path.join(outdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(script(shell))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
