"""The `gpumemctl` program: where a command line starts (the console script's `main`).

The command line itself is declared with typer in gpumemctl/commands.py (docs/cli.md). A
plain invocation of a command scripts run in loops (`gpumemctl ls --json`, `info`,
`create`, ...) runs without importing typer or click (gpumemctl/fastargs.py), since those
imports alone take several times as long as the interpreter's start; every other command
line goes to typer. Shell completion requests (completions/) go to gpumemctl/completion.py.

Keep this module's imports to the standard library's core: everything it imports is paid
by every call (tests/integration/test_cli_output.py checks that `ls --json` loads no typer,
click or rich; bench/core.py measures it).
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
    from .fastargs import parse
    try:
        call = parse(argv)
        if call is not None:
            return call.run()
        from .commands import run as run_typer
        code = run_typer(argv)
        from .output import flush
        flush()
        return code
    except KeyboardInterrupt:
        return INTERRUPTED
    except OSError as exc:      # outside a command's body (help, scrub): the same one line
        from .actions import report
        return report(exc)


def __getattr__(name: str):
    """`from gpumemctl.cli import app` (scripts/gen-*.py, tests) still finds the typer app."""
    if name == "app":
        from .commands import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":        # `python -m gpumemctl.cli` (gpumemd's own snapshots)
    main()
