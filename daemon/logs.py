"""The daemon's log: one line per record on stderr, with every control character escaped.

A record's text often quotes what a client chose (a name, which may hold a newline, an ESC
or a bidi override): printed raw, it forges log lines or drives the terminal of whoever
reads the log. So the formatter escapes each record's message whole, by the rule of
gpumemctl/protocol/escape.py, and no call site has to remember to. A traceback keeps its line
breaks (its frames are the daemon's own code) but the exception's message in it is escaped
the same way. And each client's lines are within its budget (daemon/logbudget.py): the
handler's filter leaves out what a client causes past its share.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback

from gpumemctl.protocol.escape import escape

from .core.permissions import administrative_uid
from .logbudget import ClientLines

# journald's priorities for Python's levels (sd-daemon(3): "<N>" prefixes on stderr lines).
JOURNAL_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}


class LineFormatter(logging.Formatter):
    """Escapes the message (and the exception's message in a traceback). The timestamp's
    text is made once per second, not per record: the mount logs one `event` line per
    create and unlink, and each microsecond of a line is one of every such request."""

    _second: int | None = None
    _second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format,
                                              self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._second_text, record.msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        return escaped_traceback(ei[1]) if ei[1] is not None else super().formatException(ei)


class JournalFormatter(LineFormatter):
    """For stderr connected to journald: no timestamp (the journal adds its own, and a second
    one only clutters `journalctl`), and the level as a "<N>" priority prefix, which journald
    turns into the entry's PRIORITY (so `journalctl -p warning` works)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prio = JOURNAL_PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in text.split("\n"))


def escaped_traceback(exc: BaseException) -> str:
    """What traceback.format_exception() gives, each exception's own text made one escaped
    line. Chained exceptions (cause or context) come first, as Python prints them."""
    parts = []
    for i, one in enumerate(_chain(exc)):
        if i:
            parts.append("\nThe above exception was the direct cause of the following "
                         "exception:\n\n" if one.__cause__ is not None else
                         "\nDuring handling of the above exception, another exception "
                         "occurred:\n\n")
        if one.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(one.__traceback__))
        only = "".join(traceback.format_exception_only(type(one), one)).rstrip("\n")
        parts.append(escape(only) + "\n")
    return "".join(parts).rstrip("\n")


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during, oldest first."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    one: BaseException | None = exc
    while one is not None and id(one) not in seen:
        seen.add(id(one))
        chain.append(one)
        one = one.__cause__ or (None if one.__suppress_context__ else one.__context__)
    return chain[::-1]


def stderr_is_journal() -> bool:
    """$JOURNAL_STREAM is "DEVICE:INODE" of the stream systemd connected; it counts only if
    stderr is still that stream (systemd.exec(5)): a shell redirect inherits the variable."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(level: str) -> ClientLines:
    """One line per record on stderr. With a timestamp on a terminal or in a file; without,
    and with priority prefixes, under journald. Returns the handler's filter that keeps
    each client within its share of lines (daemon/logbudget.py).

    A record leaves out what no line shows: the caller's file and line (found by walking
    the stack for every record), the thread's and the process's names (logging's own
    optimisation switches). The process id stays: it is in every line."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(levelname)s: %(message)s"))
    else:
        handler.setFormatter(LineFormatter(
            "%(asctime)s gpumemd[%(process)d] %(levelname)s: %(message)s"))
    lines = ClientLines(administrative_uid)
    handler.addFilter(lines)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return lines
