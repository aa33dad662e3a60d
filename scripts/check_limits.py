#!/usr/bin/env python3
"""The size limits of `make lint` (issue 25, docs/architecture.md "Limits that keep it so"):

- no module of the packages (daemon, gpumemctl, tui) is over MAX_LINES lines;
- no class of the daemon has more than MAX_PUBLIC_METHODS public methods (functions and
  properties whose names do not start with `_`), but for the FUSE interface: a subclass of
  `pyfuse3.Operations` implements the methods libfuse calls, whatever their number.

A centre that grows past these has taken on a second job: the answer is a new unit, never
an exception here. Prints one line per breach and exits 1; prints nothing and exits 0 when
all is within bounds.

    python3 scripts/check_limits.py [ROOT]
"""
from __future__ import annotations

import ast
import os
import sys

MAX_LINES = 500
MAX_PUBLIC_METHODS = 25
PACKAGES = ("daemon", "gpumemctl", "tui")
CLASS_PACKAGES = ("daemon",)
EXEMPT_BASES = {"pyfuse3.Operations", "Operations"}   # the FUSE interface: libfuse's methods


def modules(root: str, package: str):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def base_name(node: ast.expr) -> str:
    return ast.unparse(node)


def public_methods(cls: ast.ClassDef) -> list[str]:
    return [item.name for item in cls.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and not item.name.startswith("_")]


def breaches(root: str) -> list[str]:
    out = []
    for package in PACKAGES:
        for path in modules(root, package):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            rel = os.path.relpath(path, root)
            lines = text.count("\n") + (not text.endswith("\n") and bool(text))
            if lines > MAX_LINES:
                out.append(f"{rel}: {lines} lines, more than {MAX_LINES}")
            if package not in CLASS_PACKAGES:
                continue
            for node in ast.walk(ast.parse(text, rel)):
                if not isinstance(node, ast.ClassDef):
                    continue
                if {base_name(b) for b in node.bases} & EXEMPT_BASES:
                    continue
                methods = public_methods(node)
                if len(methods) > MAX_PUBLIC_METHODS:
                    out.append(f"{rel}:{node.lineno}: class {node.name} has {len(methods)} "
                               f"public methods, more than {MAX_PUBLIC_METHODS}")
    return out


def main(argv: list[str]) -> int:
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    found = breaches(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
