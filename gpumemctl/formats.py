"""How values are read from and written for people, shared by the CLI and the TUI
(`gpumemctl top`). Standard library only: the CLI imports it at start-up."""
from __future__ import annotations

import datetime
import re

from .protocol import UsageError


def parse_mode(text: str) -> int:
    """Octal permission bits, e.g. "0640"; anything else is a usage error naming it."""
    text = text.strip()
    if not re.fullmatch(r"[0-7]{1,4}", text):
        raise UsageError(f"invalid mode {text!r}: expected octal permission bits 0000-7777, "
                         "such as 0640")
    return int(text, 8)


def duration(seconds: float | None, unknown: str = "unknown") -> str:
    """12s, 3m05s, 1h02m05s."""
    if seconds is None:
        return unknown
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def event_line(e: dict, *, date: bool = True) -> str:
    """One event as `gpumemctl events` prints it; without `date`, the time of day only
    and no id (the TUI's narrow events panel)."""
    when = datetime.datetime.fromtimestamp(e["time_ns"] / 1e9, tz=datetime.timezone.utc)
    who = f" uid={e['uid']}" if e.get("uid") is not None else ""
    detail = " ".join(f"{k}={v}" for k, v in sorted(e.get("detail", {}).items()))
    head = f"{e['id']:>6} {when:%Y-%m-%dT%H:%M:%SZ}" if date else f"{when:%H:%M:%S}"
    return f"{head} {e['kind']:<9} {e.get('path') or '-'}{who} {detail}".rstrip()
