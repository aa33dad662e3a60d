"""The `gpumemctl` program: where a command line starts (the console script's `main`).

The commands are declared in this package, one module per group of them (root.py names the
modules; how a command is declared: declare.py). A plain invocation of a command scripts run
in loops (`gpumemctl ls --json`, `info`, `create`, ...) runs without importing typer or click
(plain.py), since those imports alone take several times as long as the interpreter's start;
every other command line goes to typer (typerapp.py). Shell completion requests
(completions/) go to completion.py.

Keep this module's imports to the standard library's core: everything it imports is paid
by every call (tests/integration/test_cli_output.py checks that `ls --json` loads no typer,
click or rich; bench/core.py measures it). The client library never imports this package
(an import contract in pyproject.toml).
"""
from __future__ import annotations

import sys

INTERRUPTED = 130           # 128 + SIGINT: what click exits with on Ctrl-C, too


def main() -> None:
    from .completion import requested
    shell = requested()
    if shell:                       # started by a completion script (completions/)
        from .completion import run as complete
        sys.exit(complete(shell))
    sys.exit(run(sys.argv[1:]))


def run(argv: list[str]) -> int:
    from .plain import parse
    try:
        call = parse(argv)
        if call is not None:
            return call.run()
        from .typerapp import run as run_typer
        code = run_typer(argv)
        from ..output import flush
        flush()
        return code
    except KeyboardInterrupt:
        return INTERRUPTED
    except OSError as exc:      # outside a command's body (help, scrub): the same one line
        from .context import report
        return report(exc)


def __getattr__(name: str):
    """`from gpumemctl.cli import app` (scripts/gen-*.py, tests) finds the typer app."""
    if name == "app":
        from .typerapp import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
