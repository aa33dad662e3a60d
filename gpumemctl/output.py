"""All terminal output of the CLI: data on stdout, diagnostics on stderr.

A user error is one line on stderr ("gpumemctl: error: ..."); a bug prints its traceback.
An OSError writing stdout (a full disk, a closed pipe) comes out of every writer here with
its `filename` set to STDOUT_NAME, so that gpumemctl/cli/context.py `report` can name stdout in
its one line (docs/cli.md, "Local files").
Every line for a person goes through `escape()` here, and only here (callers pass raw
names): a name's newline or ESC is shown as `\\n` or `\\x1b`, never obeyed
(gpumemctl/protocol/escape.py has the rule). JSON is written as it is (`emit_json`,
`json_line`): it escapes control characters itself.
"""
from __future__ import annotations

import sys
import time

from .protocol import format_size
from .protocol.escape import escape
from .protocol.jsontext import dumps as compact_json

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Set

STDOUT_NAME = "<stdout>"            # what an OSError writing stdout names (as sys.stdout.name)
STDIN_NAME = "<stdin>"


def write(text: str) -> None:
    """Text as it is, no newline added (one line for a person goes through `data`)."""
    try:
        _stdout().write(text)
    except OSError as exc:
        raise named_stdout(exc) from None


def _stdout():
    """sys.stdout; None when the program started with fd 1 closed (`gpumemctl ls >&-`)."""
    if sys.stdout is None:
        import errno
        import os
        raise OSError(errno.EBADF, os.strerror(errno.EBADF), STDOUT_NAME)
    return sys.stdout


def named_stdout(exc: OSError) -> OSError:
    """`exc` (raised writing stdout) with stdout as its file, unless it names one already."""
    if exc.filename is None:
        exc.filename = STDOUT_NAME
    return exc


def flush() -> None:
    """Push out what is buffered for stdout (a command's last step: its errors are ours to
    report, not the interpreter's at exit)."""
    if sys.stdout is None:
        return                          # nothing was written (that would have failed)
    try:
        sys.stdout.flush()
    except OSError as exc:
        raise named_stdout(exc) from None


def raw(data: bytes) -> None:
    """Bytes as they are (a value into a pipe or file)."""
    try:
        out = _stdout()
        out.flush()
        out.buffer.write(data)
    except OSError as exc:
        raise named_stdout(exc) from None


def detach_stdout() -> None:
    """After stdout failed (EPIPE, ENOSPC): point fd 1 at /dev/null, so that the flush at
    interpreter exit finds somewhere to put what is still buffered, rather than printing
    "Exception ignored ..." (the Python docs' advice for SIGPIPE)."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def data(text: str = "") -> None:
    """One line for a person: a newline inside `text` is shown escaped, not obeyed."""
    write(escape(text) + "\n")


def trusted_text(text: str) -> None:
    """Text of our own, written as it is (help: many lines, no names in it)."""
    write(text + "\n")


def json_line(obj) -> None:
    """One JSON object on a line (`events --follow --json`)."""
    import json
    write(json.dumps(obj) + "\n")


def emit_json(obj) -> None:
    """Indented for a person at a terminal; compact (and C-encoded, ~10x faster for big
    listings) when piped into jq or a script."""
    if sys.stdout.isatty():
        import json
        text = json.dumps(obj, indent=2, sort_keys=True)
    else:
        # Key order is the daemon's, fixed by daemon/core/describe.py: no need to sort again.
        text = compact_json(obj)
    write(text + "\n")


def error(message: str) -> None:
    try:
        print(f"gpumemctl: error: {escape(message)}", file=sys.stderr)
    except OSError:         # stderr itself is gone or full: the exit status still says it
        pass


def warning(message: str) -> None:
    """Something a script should see too (stderr, whatever it is): the answer is partial.
    Escaped as error() is: a warning may quote a name or a store entry another user chose."""
    try:
        print(f"gpumemctl: warning: {escape(message)}", file=sys.stderr)
    except OSError:
        pass


def usage_error(message: str, hint: str | None) -> None:
    """A command line that cannot run: the error line, then where help is."""
    error(message)
    if hint:
        print(escape(hint), file=sys.stderr)


def note(message: str) -> None:
    """A confirmation for a person at a terminal; silent when stderr is not a TTY."""
    if sys.stderr.isatty():
        print(escape(message), file=sys.stderr)


def table(rows: list[list[str]], headers: list[str], right: Set[int] = frozenset()) -> None:
    """Columns of cells; each cell escaped before the widths are taken, so that they line up
    (rows are written with sys.stdout.write: escaping them again would double backslashes)."""
    rows = [[escape(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=False)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=False))).rstrip()
    write(fmt(headers) + "\n")
    for row in rows:
        write(fmt(row) + "\n")


class Progress:
    """A one-line progress meter on stderr, only for a TTY and only for long transfers."""
    MIN_BYTES = 64 << 20

    def __init__(self, label: str, total: int, enabled: bool | None = None):
        self.label, self.total = label, total
        self.enabled = sys.stderr.isatty() and total >= self.MIN_BYTES \
            if enabled is None else enabled
        self.start = time.monotonic()
        self.last = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int = 0, detail: str = "") -> None:
        """`total`, when given, replaces the one known at the start; `detail` goes between
        the label and the figures."""
        if not self.enabled:
            return
        if total:
            self.total = total
        now = time.monotonic()
        if now - self.last < 0.2 and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-6)
        pct = f"{100 * done / self.total:5.1f}% " if self.total else ""
        eta = f", ETA {(self.total - done) / rate:.0f} s" \
            if self.total > done and rate > 0 else ""
        head = escape(f"{self.label}: {detail}: " if detail else f"{self.label}: ")
        sys.stderr.write(f"\r{head}{pct}{format_size(done)} at "
                         f"{format_size(int(rate))}/s{eta}\x1b[K")
        sys.stderr.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.enabled and self.drawn:
            sys.stderr.write("\n")


class WorkProgress(Progress):
    """The meter of a daemon-side long call (verify, recover): fed the daemon's progress
    frames, {path, done_bytes, total_bytes, allocations_done, allocations}, it shows
    "allocation i/n path: percent, bytes at bytes/s". Only when stderr is a TTY; when it
    is not, `callback` is None and the CLI asks the daemon for no progress at all."""

    def __init__(self, label: str, enabled: bool | None = None):
        super().__init__(label, 0, sys.stderr.isatty() if enabled is None else enabled)

    @property
    def callback(self):
        return self.frame if self.enabled else None

    def frame(self, p: dict) -> None:
        n = p.get("allocations") or 0
        if not n:
            return              # nothing to verify: nothing to show
        i = min(p.get("allocations_done", 0) + 1, n)
        detail = f"allocation {i}/{n} {p.get('path') or ''}".rstrip()
        self(p.get("done_bytes", 0), p.get("total_bytes", 0), detail)

    def finish(self) -> None:
        """Erase the meter: the command's own summary follows (on stdout)."""
        if self.enabled and self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
