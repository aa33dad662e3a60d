"""The rates transport.ConnectionLimits applies to each user's connections (docs/security.md):
the pace of new connections (OpenRate), how many refused ones hear why (RefusalAnswers),
and the once-a-minute warning of what was refused or cut off (MinuteWarning).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..core.events import LineBudget

log = logging.getLogger("gpumemd")


class MinuteWarning:
    """A warning logged at most once a minute, with how often it happened meanwhile: a
    flood must not flood the log too. The format's first %d is that count."""

    def __init__(self) -> None:
        self.count, self._logged = 0, -float("inf")

    def happened(self, fmt: str, *args: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged >= 60:
            log.warning(fmt, self.count, *args)
            self._logged, self.count = now, 0


class RefusalAnswers(LineBudget):
    """How many refused connections of each uid hear `busy` and why: 64 at once, then 2 a
    second (the token bucket of log lines, events.LineBudget, with these figures). A client
    refused now and then is always told; a loop of connects is mostly closed unanswered,
    each costing the daemon no more than its accept()."""

    LINES_BURST = 64
    LINES_PER_SECOND = 2.0


class OpenRate:
    """The pace of each uid's new connections: `burst` at once, then one each 1/`per_second`
    s. A connection past it is not refused: it waits its turn (`delay`), counted among its
    user's connections meanwhile, so a user's loop of connects is slowed to the pace, and
    past its max_connections_per_uid refused at the cost of an accept()."""

    def __init__(self, burst: int, per_second: float):
        self.burst, self.per_second = float(burst), float(per_second)
        self._tokens: dict[int, tuple[float, float]] = {}   # uid: (tokens, when counted)

    def delay(self, uid: int, now: float | None = None) -> float:
        """Take `uid`'s next turn: how long from now it comes (0: at once)."""
        now = time.monotonic() if now is None else now
        tokens, then = self._tokens.get(uid, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_second) - 1
        self._tokens[uid] = (tokens, now)
        if len(self._tokens) > 4096:           # forget the users that are quiet again
            self._tokens = {u: t for u, t in self._tokens.items() if t[0] < self.burst - 1}
        return max(0.0, -tokens / self.per_second)
