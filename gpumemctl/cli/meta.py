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

from .. import output
from .context import connect, want_json
from .declare import JSON, Arg, Group, Opt

commands = Group()
meta = commands.group("meta", help="User metadata: small key-value pairs kept on an "
                                   "allocation or a directory, also its user.KEY attributes "
                                   "on the mount.", no_args_is_help=True)

NAME = Arg("Allocation or directory name, e.g. models/llama.", complete=True)
KEY = Arg("Metadata key: 1 to 250 bytes, no NUL, not starting 'gpu.'.")


def _raw(text: str) -> bytes:
    """The bytes a key or value stands for (surrogateescape, as names)."""
    return text.encode("utf-8", "surrogateescape")


@meta.command("ls", name=NAME, json_=JSON)
def ls(name: str, json_: bool = False):
    """Every key of NAME's metadata with its value, one `key=value` per line (escaped for
    the terminal as names are: docs/cli.md)."""
    with connect() as c:
        result = c.call("meta_list", path=name)
    if want_json(json_):
        output.emit_json(result)
        return
    for key, value in result["metadata"].items():
        output.data(f"{key}={value}")


@meta.command("get", name=NAME, key=KEY, json_=JSON)
def get(name: str, key: str, json_: bool = False):
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


@meta.command(
    "set", name=NAME, key=KEY,
    value=Arg("The value (any bytes, empty too), or - to read it from stdin."),
    create=Opt("--create", help="Fail (exit 5) if KEY is set already."),
    replace=Opt("--replace", help="Fail (exit 4) if KEY is not set."),
    json_=JSON)
def set_(name: str, key: str, value: str, create: bool = False, replace: bool = False,
         json_: bool = False):
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


@meta.command("rm", name=NAME, key=KEY, json_=JSON)
def rm(name: str, key: str, json_: bool = False):
    """Remove KEY from NAME's metadata. Exit 4 if it is not set."""
    with connect() as c:
        result = c.meta_rm(name, key)
    if want_json(json_):
        output.emit_json(result)
