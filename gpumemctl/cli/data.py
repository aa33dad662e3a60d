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
                  file=Arg("Input file, or - for stdin."), offset=OFFSET,
                  grow=Opt("--grow", help="First grow NAME to hold all of the input "
                           "(stdin is read to its end first)."),
                  json_=JSON)
def write(name: str, file: str = "-", offset: str = "0", grow: bool = False,
          json_: bool = False):
    """Write FILE (or stdin) into NAME at --offset.

    Without --grow, input past NAME's size is refused before anything is written."""
    from ..localfiles import open_input
    start = parse_offset(offset)
    src = sys.stdin.buffer if file == "-" else open_input(file, regular_only=False)
    if grow and not _is_regular(src):
        src = _spooled(src)              # a pipe's length is known once it is read
    total = os.fstat(src.fileno()).st_size if _is_regular(src) else None
    meter = output.Progress(f"write {name}", total or 0)
    with connect() as c:
        if grow and total is not None:
            node = c.info(name)
            if node["type"] == "allocation" and start + total > node["size"]:
                c.resize(name, start + total)
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


def _is_regular(f) -> bool:
    import stat
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (OSError, ValueError):
        return False


def _spooled(src):
    """A pipe's bytes in an unlinked temporary file (in $TMPDIR), read to its end, so
    that --grow knows how much room to make."""
    import shutil
    import tempfile
    spool = tempfile.TemporaryFile()
    shutil.copyfileobj(src, spool, 16 << 20)
    spool.seek(0)
    return spool
