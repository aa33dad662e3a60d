"""Text for a terminal or a log line: control characters made visible, never obeyed.

Names, and every string a client can choose, may hold any character but NUL and `/`: a
newline that forges a line of `gpumemctl ls`, an ESC that starts a terminal escape (an OSC
title, clear-screen), a bidi override that reorders what follows. Every human output (the
CLI, the monitor, the daemon's log) passes its text through `escape()` exactly once, at the
point where it is written; `--json` does not (JSON escapes them itself, and stays exact).

The rule, like Python's string literals or `ls --quoting-style=escape`:
- `\\` for a backslash, so that every backslash shown starts an escape;
- `\\n`, `\\r`, `\\t` for newline, carriage return and tab;
- `\\xHH` for the other C0 controls and DEL, and for a byte that is not UTF-8 (a name
  decoded with surrogateescape: its byte, as `ls` shows it);
- `\\uHHHH` for the C1 controls (U+0080-U+009F), the bidi controls (U+061C, U+200E/F,
  U+202A-U+202E, U+2066-U+2069), the line and paragraph separators and other surrogates.
Everything else, printable text in any script, is shown as it is. Standard library only and
cheap: the CLI's fast path imports it, and a listing of 10^5 plain names costs one
str.isprintable() each.
"""
from __future__ import annotations

_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_WIDE = frozenset(map(chr, (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
                            *range(0x2066, 0x206A))))


def _one(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:            # os.fsdecode's stand-in for an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    if 0x80 <= code <= 0x9F or ch in _WIDE or 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04x}"
    return ch


def escape(text: str) -> str:
    """`text` with control characters and backslashes escaped (the module's rule)."""
    if text.isprintable() and "\\" not in text:
        return text                     # the common case: nothing to do
    return "".join(map(_one, text))


def has_controls(text: str) -> bool:
    """Whether `text` holds a character escape() shows escaped, a backslash aside."""
    return not text.isprintable() and any(ch != "\\" and _one(ch) != ch for ch in text)
