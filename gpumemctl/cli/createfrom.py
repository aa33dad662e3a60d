"""`gpumemctl create --from FILE`: every `NAME SIZE` line of FILE (or stdin) created in one
request, `Client.create_many` (docs/cli.md).

The whole input is read and checked first: a line that is not `NAME SIZE` (the size is the
last word, the name the rest of the line, blanks around both dropped), or whose name or size
is not one, is reported with its line number, and then nothing is created (exit 2). Blank
lines and lines starting with `#` are skipped. Then every entry is created with the command's
options; each is one line on stdout (created) or stderr (its error, with its line number),
or with --json one list of `{name, line, ok, result/error}`. The exit status is the first
failing line's code, 0 when every one was created.
"""
from __future__ import annotations

import sys

from .. import output
from ..protocol import GpumemError, UsageError, format_size, parse_size, split_path
from ..protocol.errors import OK, USAGE
from .context import connect

MALFORMED_SHOWN = 20        # malformed lines named one by one; past it, how many more


def create_from(source: str, *, durable: bool, device: str | None, mode: int,
                ecc: str | None, exist_ok: bool, json_: bool) -> int:
    label = "stdin" if source == "-" else source
    entries, malformed = parse(_read(source), label)
    for message in malformed[:MALFORMED_SHOWN]:
        output.error(message)
    if malformed:
        if len(malformed) > MALFORMED_SHOWN:
            output.error(f"{label}: {len(malformed) - MALFORMED_SHOWN} more malformed lines")
        output.error(f"{label}: {len(malformed)} malformed line"
                     f"{'s' if len(malformed) > 1 else ''}: nothing was created")
        return USAGE
    with connect() as c:
        results = c.create_many([(name, size) for _, name, size in entries],
                                durable=durable, mode=mode, device=device, ecc=ecc,
                                exist_ok=exist_ok)
    code, report = OK, []
    for (line, name, _), result in zip(entries, results, strict=True):
        if isinstance(result, GpumemError):
            output.error(f"{label}:{line}: {result}")
            report.append({"name": name, "line": line, "ok": False,
                           "error": result.to_wire()})
            code = code or result.code
            continue
        report.append({"name": name, "line": line, "ok": True, "result": result})
        if not json_:
            output.data(f"created {result['path']}: {format_size(result['size'])} (capacity "
                        f"{format_size(result['capacity'])}) on {result['device']}, "
                        f"{'durable' if result['durable'] else 'transient'}")
    if json_:
        output.emit_json(report)
    return code


def parse(text: str, label: str) -> tuple[list[tuple[int, str, int]], list[str]]:
    """(line number, name, size) of each entry, and a message for each malformed line."""
    entries: list[tuple[int, str, int]] = []
    malformed: list[str] = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.rsplit(None, 1)
        if len(words) != 2:
            malformed.append(f"{label}:{number}: expected NAME SIZE, got {_cut(line)}")
            continue
        name, size = words[0].strip(), words[1]
        try:
            split_path(name)
            entries.append((number, name, parse_size(size)))
        except GpumemError as exc:
            malformed.append(f"{label}:{number}: {exc}")
    return entries, malformed


# The most a list may hold: a file someone else controls (a link to /dev/zero, a FIFO that
# never ends) must not make the caller read without end. 64 MiB is about a million lines.
MAX_LIST_BYTES = 64 << 20


def _read(source: str) -> str:
    """All of FILE (or stdin), its bytes as names are (UTF-8, surrogateescape); at most
    MAX_LIST_BYTES (a usage error past it, nothing created)."""
    if source == "-":
        try:
            raw = sys.stdin.buffer.read(MAX_LIST_BYTES + 1)
        except OSError as exc:
            exc.filename = exc.filename or output.STDIN_NAME
            raise
    else:
        from ..localfiles import file_error, open_input
        with open_input(source, regular_only=False) as f:
            try:
                raw = f.read(MAX_LIST_BYTES + 1)
            except OSError as exc:
                raise file_error(exc, source, "read") from None
    if len(raw) > MAX_LIST_BYTES:
        raise UsageError(f"{'standard input' if source == '-' else source} holds more than "
                         f"{MAX_LIST_BYTES >> 20} MiB, the most a --from list may: nothing "
                         "created (split it)")
    return raw.decode("utf-8", "surrogateescape")


def _cut(line: str) -> str:
    return repr(line if len(line) <= 60 else line[:57] + "...")
