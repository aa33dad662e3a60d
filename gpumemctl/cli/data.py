"""`gpumemctl write|read`: bytes between an allocation and a file or a pipe, both declared
`plain` (run without typer for scripts: gpumemctl/cli/plain.py)."""
from __future__ import annotations

import os
import sys

from .. import output
from ..protocol import parse_size
from .context import connect, parse_offset, want_json
from .declare import JSON, NAME, OFFSET, Arg, Group, Opt

commands = Group()


@commands.command("write", plain=True, name=NAME,
                  file=Arg("Input file, or - for stdin."), offset=OFFSET, json_=JSON)
def write(name: str, file: str = "-", offset: str = "0", json_: bool = False):
    """Write FILE (or stdin) into NAME at --offset."""
    from ..localfiles import open_input
    start = parse_offset(offset)
    src = sys.stdin.buffer if file == "-" else open_input(file, regular_only=False)
    total = os.fstat(src.fileno()).st_size if file != "-" else None
    meter = output.Progress(f"write {name}", total or 0)
    with connect() as c:
        done = c.write_from(name, src, start, progress=meter, total=total)
    meter.finish()
    if want_json(json_):
        output.emit_json({"name": name, "offset": start, "bytes": done})


@commands.command("read", plain=True, name=NAME,
                  file=Arg("Output file, or - for stdout."), offset=OFFSET,
                  length=Opt("--length", help="Bytes to read."))
def read(name: str, file: str = "-", offset: str = "0", length: str | None = None):
    """Read NAME (from --offset, --length bytes) to FILE or stdout."""
    start = parse_offset(offset)
    count = None if length is None else parse_size(length, allow_zero=True)
    out = sys.stdout.buffer if file == "-" else _open_output(file)
    with connect() as c:
        node = c.info(name)
        size = node["size"] if node["type"] == "allocation" else None
        total = count if count is not None else max((size or 0) - start, 0)
        meter = output.Progress(f"read {name}", total)
        c.read_to(name, out, start, count, progress=meter)
    try:
        out.flush()
    except OSError as exc:
        if exc.filename is None:
            exc.filename = output.STDOUT_NAME if file == "-" else file
        raise
    meter.finish()


def _open_output(path: str):
    """FILE of `read`: opened for writing as `dd of=FILE` does (created, truncated; a
    device or FIFO written as it is)."""
    try:
        return open(path, "wb")
    except OSError as exc:
        from ..localfiles import file_error
        raise file_error(exc, path, "write") from None
