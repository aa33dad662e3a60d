"""The top of gpumemctl's command tree: the program's own options (`--socket`, `--json`,
`--version`, read before the command) and the modules that declare its commands, one per
group of commands (docs/architecture.md). Typer's app (gpumemctl/cli/typerapp.py) and the fast
path (gpumemctl/cli/plain.py) are both built from this table and those modules."""
from __future__ import annotations

from .. import output
from ..protocol.defaults import SOCKET_ENV
from . import context
from .declare import Opt

PROG = "gpumemctl"
HELP = "Inspect and manage durable GPU memory served by gpumemd."
# The modules of gpumemctl/cli/ that declare commands, each in its `commands`. The fast path
# looks a command up in this order, importing no module past the one that has it: the
# commands scripts run in loops come first.
MODULES = ("names", "data", "daemon", "integrity", "weights", "meta", "snapshot", "sleepwake")


def print_version() -> None:
    """`gpumemctl --version` (before any command is looked for): the distribution's one
    version, worded as `gpumemd --version` words its own."""
    from .. import __version__
    output.data(f"{PROG} {__version__}")


OPTIONS = {
    "socket": Opt("--socket", envvar=SOCKET_ENV, help="gpumemd's socket."),
    "json_": Opt("--json", help="JSON output for every command."),
    "version": Opt("--version", action=print_version, help="Print gpumemctl's version and exit."),
}


# The global options, as typer or the fast path read them (no docstring: typer would take it
# for the program's help, which is HELP).
def main_options(socket: str | None = None, json_: bool = False, version: bool = False) -> None:
    context.Settings.socket = socket
    context.Settings.json = json_
