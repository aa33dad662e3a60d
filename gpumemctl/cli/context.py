"""What every command's body shares, whichever way its command line was read (typer, or the
fast path of gpumemctl/cli/plain.py): the global options, the connection to gpumemd, and how
a body runs and how its errors end (one line on stderr and the exit status: docs/cli.md).
No typer or click here: the fast path imports this module.
"""
from __future__ import annotations

import errno

from .. import output
from ..protocol import GpumemError, UsageError, parse_size
from ..protocol.errors import OK

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..client import Client


class CommandLineError(UsageError):
    """A command line its body finds it cannot run (arguments that go only together, or
    never): one line and where help is, exit 2, as typer words the usage errors it finds."""

    def __init__(self, message: str, command: str):
        super().__init__(message)
        self.hint = f"Try 'gpumemctl {command} -h' for help."


class Settings:
    """The global options (`gpumemctl --socket PATH --json COMMAND`)."""
    socket: str | None = None
    json: bool = False


def want_json(flag: bool) -> bool:
    return flag or Settings.json


def connect() -> Client:
    from ..client import Client
    return Client(Settings.socket)


def invoke(body: Callable[..., int | None], params: dict) -> int:
    """Run a command's body; returns its exit status. Its errors go through `report`."""
    try:
        code = body(**params)
        output.flush()
    except (GpumemError, OSError) as exc:
        return report(exc, as_json=want_json(bool(params.get("json_"))))
    return code or OK


def report(exc: GpumemError | OSError, *, as_json: bool = False) -> int:
    """The one place an error becomes its line on stderr and the exit status (docs/cli.md,
    "Exit status" and "Local files"): a GpumemError is its message and code; an OSError on
    a local file (its `filename` set: every path and stdout writer sets it) the path, the
    errno's words and the errno's code; a reader that went away (`gpumemctl ls | head -1`,
    EPIPE) is not our error: exit 0, quietly. Any other OSError is a bug: its traceback.
    `as_json` (the command's --json): the error is also a JSON document on stdout,
    {"error": {code, name, message, details}}, with the numbers the line names."""
    if isinstance(exc, OSError):
        to_stdout = exc.filename in (None, output.STDOUT_NAME)
        if exc.errno == errno.EPIPE:
            if to_stdout:
                output.detach_stdout()
            return OK
        if exc.filename is None:
            raise exc
        from ..localfiles import file_error
        if to_stdout:
            output.detach_stdout()
        exc = file_error(exc)
    if isinstance(exc, CommandLineError):
        output.usage_error(str(exc), exc.hint)
    else:
        from ..protocol.owners import with_user_names
        output.error(with_user_names(str(exc)))
    if as_json:     # a script reading --json gets a document either way (issue 27)
        output.emit_json({"error": exc.to_wire()})
    try:                # what the command printed before it failed, if stdout takes it
        output.flush()
    except OSError:
        output.detach_stdout()
    return exc.code


def parse_offset(text: str) -> int:
    return 0 if text in ("0", "") else parse_size(text, allow_zero=True)
