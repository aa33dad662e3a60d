"""`gpumemctl meta ls|get|set|rm` (issue 17): user metadata, small key-value pairs kept on an
allocation or a directory (docs/cli.md; the rules and bounds: docs/protocol.md, "User
metadata"). The same pairs are the `user.KEY` extended attributes on the mount.

Exit codes as everywhere (docs/cli.md): 0 done; 2 a bad key, a value past
metadata_max_bytes, or a symbolic link or special file; 4 no such name or key; 5 `set
--create` of a key that is set; 6 permission denied (read permission to list or get, write
permission to set or remove); 7 past the owner's metadata_user_max_bytes.
"""
from __future__ import annotations

import sys
from typing import Annotated

import typer

from . import output
from .actions import connect, want_json
from .subapp import run_body

meta_app = typer.Typer(help="User metadata: small key-value pairs kept on an allocation or "
                            "a directory, also its user.KEY attributes on the mount.",
                       no_args_is_help=True)


def complete_name(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """TAB on a name: ask the daemon (gpumemctl/completion.py)."""
    from .completion import allocation_names
    return allocation_names(ctx.find_root().params.get("socket"), incomplete)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (for scripts).")]
NameArg = Annotated[str, typer.Argument(help="Allocation or directory name, e.g. "
                                             "models/llama.", autocompletion=complete_name)]
KeyArg = Annotated[str, typer.Argument(help="Metadata key: 1 to 250 bytes, no NUL, not "
                                            "starting 'gpu.'.")]


def _raw(text: str) -> bytes:
    """The bytes a key or value stands for (surrogateescape, as names)."""
    return text.encode("utf-8", "surrogateescape")


@meta_app.command("ls")
@run_body
def ls(name: NameArg, json_: JsonOpt = False):
    """Every key of NAME's metadata with its value, one `key=value` per line (escaped for
    the terminal as names are: docs/cli.md)."""
    with connect() as c:
        result = c.call("meta_list", path=name)
    if want_json(json_):
        output.emit_json(result)
        return
    for key, value in result["metadata"].items():
        output.data(f"{key}={value}")


@meta_app.command("get")
@run_body
def get(name: NameArg, key: KeyArg, json_: JsonOpt = False):
    """The value of KEY, and a newline. To a terminal it is escaped as names are; into a
    pipe or a file its bytes are written as they are. Exit 4 if KEY is not set."""
    with connect() as c:
        result = c.call("meta_get", path=name, key=key)
    if want_json(json_):
        output.emit_json(result)
    elif sys.stdout.isatty():
        output.data(result["value"])
    else:
        output.raw(_raw(result["value"]) + b"\n")


@meta_app.command("set")
@run_body
def set_(name: NameArg, key: KeyArg,
         value: Annotated[str, typer.Argument(help="The value (any bytes, empty too), or - "
                                                   "to read it from stdin.")],
         create: Annotated[bool, typer.Option(
             "--create", help="Fail (exit 5) if KEY is set already.")] = False,
         replace: Annotated[bool, typer.Option(
             "--replace", help="Fail (exit 4) if KEY is not set.")] = False,
         json_: JsonOpt = False):
    """Set KEY of NAME's metadata to VALUE. Exit 2 past metadata_max_bytes for NAME, 7 past
    the owner's metadata_user_max_bytes."""
    if value == "-":
        value = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
    with connect() as c:
        result = c.meta_set(name, key, value, create=create, replace=replace)
    if want_json(json_):
        output.emit_json(result)
    else:
        output.note(f"set {key} of {result['path']}: {result['bytes']} bytes")


@meta_app.command("rm")
@run_body
def rm(name: NameArg, key: KeyArg, json_: JsonOpt = False):
    """Remove KEY from NAME's metadata. Exit 4 if it is not set."""
    with connect() as c:
        result = c.meta_rm(name, key)
    if want_json(json_):
        output.emit_json(result)
