"""The fast path: plain invocations of the commands scripts run in loops, without typer.

Importing typer and click takes several times as long as starting the interpreter, and a
script that runs `gpumemctl ls --json` in a loop pays it on every call (issue 12). So
`gpumemctl.cli.main()` first hands argv to `parse()` here. For a command declared `plain`
(gpumemctl/cli/declare.py: ls, info, status, create, mkdir, rm, durable, transient, write and
read) written in the plain way (its options spelled in full or `--opt=value`, positional
arguments, the global `--socket` and `--json` first), it returns the call, and the command's
body runs. Anything else returns None and goes to typer: help, completion, combined short
flags, `--`, a missing or extra argument, an option it does not know.

Nothing is declared here: how each command line reads is the Spec its declaration carries
(derived from the body's parameters and their Arg/Opt, as typer derives click's), and the
global options' Spec comes from gpumemctl/cli/root.py the same way. So typer stays the one
place that words usage errors, and this module only has to read the same way:
tests/unit/test_cli_plain.py checks each Spec against the click tree typer builds, and the
parse of sample command lines against click's own.
"""
from __future__ import annotations

import os

from ..protocol.defaults import SOCKET_ENV
from . import root
from .declare import Command, Spec, plain_spec

__all__ = ["GLOBAL", "Call", "Spec", "commands", "find", "parse"]

GLOBAL = plain_spec(root.main_options, root.OPTIONS)


def find(name: str) -> Command | None:
    """The command `name` at the top of the tree, importing the modules of root.MODULES in
    order until one declares it (a plain `ls` loads only the first); None if none does or
    it names a group."""
    for module in root.MODULES:
        found = _declared(module).get(name)
        if found is not None:
            return found if isinstance(found, Command) else None
    return None


def commands() -> dict[str, Command]:
    """Every command the fast path takes, by name (this imports every module: for tests)."""
    return {name: member for module in root.MODULES
            for name, member in _declared(module).items()
            if isinstance(member, Command) and member.plain is not None}


def _declared(module: str) -> dict:
    """What the module `module` of gpumemctl/cli/ declares at the top of the tree."""
    return __import__(f"{__package__}.{module}", fromlist=["commands"]).commands.members


def __getattr__(name: str):
    """COMMANDS: command name -> Spec, for every command the fast path takes."""
    if name == "COMMANDS":
        return {name: command.plain for name, command in commands().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Call:
    """A command line understood: the command, its parameters, the global options."""

    def __init__(self, command: Command, params: dict, socket: str | None, json: bool):
        self.command, self.body = command.name, command.body
        self.params, self.socket, self.json = params, socket, json

    def run(self) -> int:
        from . import context
        context.Settings.socket, context.Settings.json = self.socket, self.json
        return context.invoke(self.body, self.params)


def parse(argv: list[str], environ=os.environ) -> Call | None:
    """The call `argv` (without the program name) makes, or None: let typer read it."""
    options, rest = _read(argv, GLOBAL, stop_at_positional=True)
    if options is None or not rest:
        return None
    command = find(rest[0])
    if command is None or command.plain is None:
        return None
    spec = command.plain
    params, positional = _read(rest[1:], spec, stop_at_positional=False)
    if params is None or not _place(positional, spec, params) or \
            any(name not in params for name in spec.needed):
        return None
    socket = options.get("socket")
    if socket is None:                      # click's envvar rule: an empty value is unset
        socket = environ.get(SOCKET_ENV) or None
    return Call(command, params, socket, options.get("json_", False))


def _read(tokens: list[str], spec: Spec, stop_at_positional: bool):
    """(options, positional arguments) as click reads them for `spec`, or (None, None)
    where anything might read differently. With `stop_at_positional` (a group: the
    command name ends its options) the rest is returned untouched."""
    options: dict = {}
    positional: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if eq and name in spec.values:
            options[spec.values[name]] = value
        elif token in spec.flags:
            options[spec.flags[token]] = True
        elif token in spec.values:
            if i + 1 == len(tokens) or _looks_like_option(tokens[i + 1]):
                return None, None
            options[spec.values[token]] = tokens[i + 1]
            i += 1
        elif _looks_like_option(token):      # -h, --help, -lR, --, unknown: typer's
            return None, None
        elif stop_at_positional:
            return options, tokens[i:]
        else:
            positional.append(token)
        i += 1
    return options, positional


def _looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-"


def _place(positional: list[str], spec: Spec, params: dict) -> bool:
    """Put the positional arguments into `params`; False if their number is wrong."""
    if len(positional) < spec.required:
        return False
    if spec.variadic:
        *single, rest = spec.positional
        params.update(zip(single, positional, strict=False))  # the rest: `rest`
        params[rest] = positional[len(single):]
        return True
    if len(positional) > len(spec.positional):
        return False
    params.update(zip(spec.positional, positional, strict=False))  # optional ones may lack
    return True
