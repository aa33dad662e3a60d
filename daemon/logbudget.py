"""Each user's share of the daemon's log (docs/security.md): every line a client can cause is
counted against that client's uid, and past its budget it is counted, not written.

Who caused a record: the uid in CLIENT_UID, a context variable set where a client's work
begins (a socket connection's task, daemon/server/transport.py; a FUSE request) and carried
by everything that work runs: trio tasks and trio.to_thread.run_sync copy the context.
Records of no client (start-up, the group commit, the scrubber, the keeper's supervision)
are never limited, nor are root's and the daemon's own uid's.

The budget is events.LineBudget, the token bucket that already bounds each user's `event`
lines (daemon/core/journal.py): LINES_BURST lines at once, then LINES_PER_SECOND. Lines left out
are summed per uid and said in one line, "uid U: N log lines left out ...", written when the
uid's lines are written again, at most once per SUMMARY_SECONDS, and by `report_left_out`
(once a minute: summarise_every_minute, in gpumemd's nursery) for a uid that went quiet
meanwhile.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator

import trio

from .core.events import LineBudget

CLIENT_UID: contextvars.ContextVar[int | None] = contextvars.ContextVar("gpumemd_client_uid",
                                                                         default=None)
SUMMARY_SECONDS = 60.0
log = logging.getLogger("gpumemd")


@contextlib.contextmanager
def acting_for(uid: int | None) -> Iterator[None]:
    """While inside, the lines logged are `uid`'s (in this task and what it starts)."""
    token = CLIENT_UID.set(uid)
    try:
        yield
    finally:
        CLIENT_UID.reset(token)


class ClientLines(logging.Filter):
    """The filter on the daemon's log handler that keeps each client uid within its
    LineBudget and writes the summaries of what it left out."""

    def __init__(self, exempt: Callable[[int], bool]):
        super().__init__()
        self.budget = LineBudget(exempt)
        self._lock = threading.Lock()        # worker threads log too
        self._since: dict[int, float] = {}   # uid: when its first line left unsaid was
        self._said: dict[int, float] = {}    # uid: when its last summary was written

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "left_out_summary", False):
            return True
        uid = CLIENT_UID.get()
        if uid is None:
            return True
        now = time.monotonic()
        with self._lock:
            if not self.budget.take(uid, now):
                self._since.setdefault(uid, now)
                return False
            due = self._due(uid, now)
        if due:
            self._say(*due)
        return True

    def _due(self, uid: int, now: float) -> tuple[int, int, float] | None:
        """(uid, count, seconds) of a summary to write now, if one is due (lock held)."""
        if uid not in self._since or now - self._said.get(uid, -SUMMARY_SECONDS) < \
                SUMMARY_SECONDS:
            return None
        self._said[uid] = now
        return uid, self.budget.left_out(uid), now - self._since.pop(uid)

    def report_left_out(self) -> None:
        """Write the summary of every uid with lines left unsaid (once a minute)."""
        now = time.monotonic()
        with self._lock:
            due = [d for uid in list(self._since) if (d := self._due(uid, now))]
        for one in due:
            self._say(*one)

    @staticmethod
    def _say(uid: int, count: int, seconds: float) -> None:
        if count:
            log.warning("uid %d: %d log lines left out in the last %.2f s (more than %d at "
                        "once or %g a second; docs/security.md)", uid, count, seconds,
                        LineBudget.LINES_BURST, LineBudget.LINES_PER_SECOND,
                        extra={"left_out_summary": True})


async def summarise_every_minute(lines: ClientLines) -> None:
    """The once-a-minute summaries, for gpumemd's nursery."""
    while True:
        await trio.sleep(SUMMARY_SECONDS)
        lines.report_left_out()
