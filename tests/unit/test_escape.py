"""The one escaping rule of human output (gpumemctl/protocol/escape.py) and the daemon's log
formatter that applies it to every record (daemon/logs.py)."""
from __future__ import annotations

import logging

import pytest

from daemon.logs import JournalFormatter, LineFormatter
from gpumemctl.protocol.escape import escape, has_controls


@pytest.mark.parametrize("raw, shown", [
    ("models/llama-7b", "models/llama-7b"),
    ("モデル/重み", "モデル/重み"),                     # printable in any script: as it is
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("\x1b]0;title\x07\x1b[2J", "\\x1b]0;title\\x07\\x1b[2J"),
    ("del\x7f", "del\\x7f"),
    ("c1\x85\x9b", "c1\\u0085\\u009b"),
    ("bidi\u202eexe\u2066", "bidi\\u202eexe\\u2066"),
    ("byte\udcff", "byte\\xff"),                           # a name that is not UTF-8
    ("back\\slash", "back\\\\slash"),                      # so every backslash is an escape
])
def test_the_rule(raw, shown):
    assert escape(raw) == shown
    assert has_controls(raw) == (shown != raw and "\\" not in raw)


def _record(msg, *args, exc=None) -> logging.LogRecord:
    return logging.LogRecord("gpumemd", logging.WARNING, __file__, 1, msg, args,
                             (type(exc), exc, exc.__traceback__) if exc else None)


def test_the_log_formatter_escapes_the_message_and_the_exceptions_text():
    forged = "x\n2026-01-01 00:00:00,000 gpumemd[1] ERROR: forged\x1b[2J"
    line = LineFormatter("%(levelname)s: %(message)s").format(
        _record("allocation '%s' is lost", forged))
    assert line == "WARNING: allocation 'x\\n2026-01-01 00:00:00,000 gpumemd[1] ERROR: " \
                   "forged\\x1b[2J' is lost"
    try:
        try:
            raise KeyError(forged)
        except KeyError as first:
            raise ValueError(f"while handling {forged}") from first
    except ValueError as exc:
        text = JournalFormatter("%(levelname)s: %(message)s").format(_record("failed", exc=exc))
    lines = text.split("\n")
    assert all(line.startswith("<4>") for line in lines)
    assert not any(line.startswith("<4>2026-01-01") for line in lines)     # no forged line
    assert "\x1b" not in text and "direct cause" in text and "Traceback" in text
