"""The fast path: plain invocations of the commands scripts run in loops, without typer.

Importing typer and click takes several times as long as starting the interpreter, and a
script that runs `gpumemctl ls --json` in a loop pays it on every call (issue 12). So
`cli.main()` first hands argv to `parse()` here. For `ls`, `info`, `status`, `create`,
`mkdir`, `rm`, `durable`, `transient`, `write` and `read` written in the plain way (the
options below, spelled in full or `--opt=value`, positional arguments, the global `--socket`
and `--json` first), it returns the call and the command runs from gpumemctl/actions.py.
Anything else returns None and goes to typer: help, completion, combined short flags,
`--`, a missing or extra argument, an option it does not know. So typer stays the one
definition of the command line and the one place that words usage errors, and this module
only has to agree with it on what it accepts: tests/unit/test_cli_plain.py checks these
tables against the click tree typer builds, and the parse of sample command lines against
click's own.
"""
from __future__ import annotations

import os

from .protocol.defaults import SOCKET_ENV


class Spec:
    """How one command's arguments read: `positional` parameter names in order (with
    `variadic`, the last takes all the rest, as a list); `required` how many positional
    arguments must be there; `flags` option -> boolean parameter it sets; `values` option ->
    parameter that takes the next argument; `needed` the value parameters that must be
    given."""

    def __init__(self, positional: tuple = (), required: int = 0, *,
                 flags: dict | None = None, values: dict | None = None,
                 variadic: bool = False, needed: tuple = ()):
        self.positional, self.required, self.variadic = positional, required, variadic
        self.flags, self.values, self.needed = flags or {}, values or {}, needed


JSON = {"--json": "json_"}
NAMES = ("names",)

GLOBAL = Spec(flags={"--json": "json"}, values={"--socket": "socket"})
COMMANDS = {
    "ls": Spec(("path",), flags={"-l": "long", "--long": "long", "-R": "recursive",
                                 "--recursive": "recursive", **JSON}),
    "info": Spec(("name",), 1, flags=JSON),
    "status": Spec(flags=JSON),
    "create": Spec(("name",), 1, flags={"--durable": "durable", "--exist-ok": "exist_ok",
                                        **JSON},
                   values={"--size": "size", "-s": "size", "--device": "device",
                           "--mode": "mode", "--ecc": "ecc"}, needed=("size",)),
    "mkdir": Spec(("name",), 1, flags={"-p": "parents", "--parents": "parents", **JSON},
                  values={"--mode": "mode"}),
    "rm": Spec(NAMES, 1, variadic=True,
               flags={"-r": "recursive", "-R": "recursive", "--recursive": "recursive",
                      "-f": "force", "--force": "force", **JSON}),
    "durable": Spec(NAMES, 1, variadic=True, flags=JSON),
    "transient": Spec(NAMES, 1, variadic=True, flags=JSON),
    "write": Spec(("name", "file"), 1, flags=JSON, values={"--offset": "offset"}),
    "read": Spec(("name", "file"), 1, values={"--offset": "offset", "--length": "length"}),
}


class Call:
    """A command line understood: the command, its parameters, the global options."""

    def __init__(self, command: str, params: dict, socket: str | None, json: bool):
        self.command, self.params, self.socket, self.json = command, params, socket, json

    def run(self) -> int:
        from . import actions
        actions.Settings.socket, actions.Settings.json = self.socket, self.json
        return actions.invoke(getattr(actions, self.command), self.params)


def parse(argv: list[str], environ=os.environ) -> Call | None:
    """The call `argv` (without the program name) makes, or None: let typer read it."""
    options, rest = _read(argv, GLOBAL, stop_at_positional=True)
    if options is None or not rest or rest[0] not in COMMANDS:
        return None
    spec = COMMANDS[rest[0]]
    params, positional = _read(rest[1:], spec, stop_at_positional=False)
    if params is None or not _place(positional, spec, params) or \
            any(name not in params for name in spec.needed):
        return None
    socket = options.get("socket")
    if socket is None:                      # click's envvar rule: an empty value is unset
        socket = environ.get(SOCKET_ENV) or None
    return Call(rest[0], params, socket, options.get("json", False))


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

