"""What the typer sub-apps (`gpumemctl snapshot ...`, `gpumemctl meta ...`) share. Only the
typer side imports it: the fast path of plain commands (gpumemctl/fastargs.py) never does."""
from __future__ import annotations

import functools

import typer

from . import actions


def run_body(func):
    """Run a command body through actions.invoke: a GpumemError is one stderr line and its
    exit code, as for every other command."""
    @functools.wraps(func)
    def wrapper(**params):
        raise typer.Exit(actions.invoke(func, params))
    return wrapper
