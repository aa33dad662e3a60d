"""The `events` table: the event log, with its bounds (docs/durability.md, "Bounds").

It keeps at most `max_events` rows (MAX_EVENTS) and `max_event_bytes` bytes of detail and
path text (MAX_EVENT_BYTES), the oldest going first; each user but root and the daemon's own
uid keeps at most EVENT_SHARE_PER_UID of the bytes. The byte counts are kept in memory and
recounted from the table after a rollback (forget_counts)."""
from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumemctl.protocol import name_bytes

from .names import loaded_name, stored_name
from .schema import Part, inserted_id

if TYPE_CHECKING:
    from .store import Registry

MAX_EVENTS = 100_000          # the event log is pruned to this many rows ...
MAX_EVENT_BYTES = 64 << 20    # ... and to this many bytes of detail and path text
EVENT_PRUNE_TO = 0.75         # pruning by bytes keeps this share of max_event_bytes
# What one user's events may take of max_event_bytes (root's, the daemon's own uid's and the
# daemon-wide ones excepted): past it, that user's oldest go, not everyone's, so that no one
# user can push the others' history out of the log (docs/security.md).
EVENT_SHARE_PER_UID = 0.25
# The bytes an event takes in the log: what max_event_bytes counts.
EVENT_BYTES_SQL = ("length(CAST(detail AS BLOB)) + COALESCE(length(CAST(path AS BLOB)), 0)")


class EventLog(Part):
    def __init__(self, registry: Registry, max_events: int, max_event_bytes: int):
        super().__init__(registry)
        self.max_events = max_events
        self.max_event_bytes = max_event_bytes
        # Pruning by rows runs every this many events (a DELETE per event would cost).
        self._prune_every = max(1, min(1000, max_events // 100))
        self._event_bytes: int | None = None    # what max_event_bytes counts; None: recount
        self._uid_event_bytes: dict[int, int] = {}   # the same per user, counted when first asked

    def forget_counts(self) -> None:
        """The byte counts are unknown (a rollback undid events added or pruned): recount
        them when next needed."""
        self._event_bytes = None
        self._uid_event_bytes.clear()

    def add(self, kind: str, node: int | None, path: str | None, uid: int | None,
            pid: int | None, detail: dict, time_ns: int) -> int:
        """Append an event (its detail bounded by the caller: daemon/core/events.py) and prune
        the oldest past MAX_EVENTS rows or max_event_bytes bytes."""
        # ensure_ascii (the default) writes a lone surrogate as "\udcff": details that
        # quote a name that is not UTF-8 stay valid TEXT and load back the same.
        text = json.dumps(detail, sort_keys=True)
        cur = self._db.execute(
            "INSERT INTO events (time_ns, kind, node, path, uid, pid, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time_ns, kind, node, None if path is None else stored_name(path), uid, pid, text))
        newest = inserted_id(cur)
        added = len(text) + (len(name_bytes(path)) if path else 0)   # as EVENT_BYTES_SQL
        if self._event_bytes is not None:
            self._event_bytes += added
        if newest % self._prune_every == 0:
            self._delete_events_through(newest - self.max_events)
        if self._event_bytes is None or self._event_bytes > self.max_event_bytes:
            self._prune_event_bytes(newest)
        if uid is not None and uid != 0 and uid != os.geteuid():
            self._prune_user_share(uid, newest, added)
        return newest

    def _prune_user_share(self, uid: int, newest: int, added: int) -> None:
        """Past its share (EVENT_SHARE_PER_UID of max_event_bytes): delete `uid`'s oldest
        events (never `newest`) down to EVENT_PRUNE_TO of the share."""
        share = int(self.max_event_bytes * EVENT_SHARE_PER_UID)
        held = self._uid_event_bytes.get(uid)
        if held is None:
            held = self._db.execute(f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events"
                                    " WHERE uid = ?", (uid,)).fetchone()[0]
        else:
            held += added
        excess = held - int(share * EVENT_PRUNE_TO)
        if held > share and excess > 0:
            cut, freed = self._oldest_to_free("uid = ? AND id < ?", (uid, newest), excess)
            if cut is not None:
                self._db.execute("DELETE FROM events WHERE uid = ? AND id <= ?", (uid, cut))
                held -= freed
                if self._event_bytes is not None:
                    self._event_bytes -= freed
        self._uid_event_bytes[uid] = held

    def _delete_events_through(self, last_id: int) -> None:
        self._uid_event_bytes.clear()       # recounted per user when next needed
        if self._event_bytes is not None:
            freed = self._db.execute(f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events"
                                     " WHERE id <= ?", (last_id,)).fetchone()[0]
            self._event_bytes -= freed
        self._db.execute("DELETE FROM events WHERE id <= ?", (last_id,))

    def size_bytes(self) -> int:
        """Bytes of detail and path text in the event log (what max_event_bytes bounds)."""
        if self._event_bytes is None:
            self._event_bytes = self._db.execute(
                f"SELECT COALESCE(SUM({EVENT_BYTES_SQL}), 0) FROM events").fetchone()[0]
        return self._event_bytes

    def _prune_event_bytes(self, newest: int) -> None:
        """Past max_event_bytes: delete the oldest events (never `newest`, the one being
        added) down to EVENT_PRUNE_TO of it, so that pruning is rare, not every event."""
        total = self.size_bytes()
        excess = total - int(self.max_event_bytes * EVENT_PRUNE_TO)
        if total <= self.max_event_bytes or excess <= 0:
            return
        cut, _ = self._oldest_to_free("id < ?", (newest,), excess)
        if cut is not None:
            self._delete_events_through(cut)

    def _oldest_to_free(self, where: str, args: tuple, excess: int) -> tuple[int | None, int]:
        """The id through which the oldest events matching `where` add up to `excess` bytes
        (or all of them), and the bytes they hold; (None, 0) when none match."""
        freed, cut = 0, None
        cur = self._db.execute(f"SELECT id, {EVENT_BYTES_SQL} FROM events WHERE {where}"
                               " ORDER BY id", args)
        for row_id, size in cur:
            freed, cut = freed + size, row_id
            if freed >= excess:
                break
        cur.close()
        return cut, freed

    def last_snapshot_reports(self, counts: Callable[[int], bool]) -> dict[str, dict]:
        """The newest `snapshot` event of each action by a uid that `counts` (the
        administrator's: status and metrics show them across restarts)."""
        out: dict[str, dict] = {}
        rows = self._db.execute("SELECT uid, time_ns, detail FROM events WHERE kind = "
                                "'snapshot' ORDER BY id DESC LIMIT 1000")
        for uid, time_ns, detail in rows:
            if uid is None or not counts(uid):
                continue
            try:
                report = json.loads(detail)
            except ValueError:
                continue
            out.setdefault(report.get("action", "?"), {**report, "time_ns": time_ns,
                                                       "uid": uid})
        return out

    def last_id(self) -> int:
        """The id of the newest event (0 when the log is empty)."""
        return self._db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def query(self, since: int = 0, limit: int = 100, path: str | None = None,
              uid: int | None = None) -> list[dict]:
        """Events after `since`, oldest first, the newest `limit` of them; with `uid`, only
        that user's and the daemon-wide ones; with `path`, those at or under it."""
        return self.page(since, limit, path, uid)[0]

    def page(self, since: int = 0, limit: int = 100, path: str | None = None,
             uid: int | None = None, max_bytes: int | None = None,
             administrator: bool = False) -> tuple[list[dict], bool]:
        """query(), and with `max_bytes` only the newest that fit in that many bytes of
        detail and path text (the newest one always), so that one answer stays bounded
        however large the log (docs/protocol.md, "Limits"). Also says whether the page is
        complete: False when older events were left out for want of bytes. With `uid`, what
        daemon/events.visible_to shows that user (`administrator`: a member of admin_group)."""
        where = "id > ?"
        args: list[int | bytes] = [since]
        if uid is not None:
            where += " AND (uid = ? OR (node IS NULL AND (uid IS NULL OR ?)))"
            args += [uid, int(administrator)]
        if path:
            # Compared as bytes: a path is TEXT or a BLOB (stored_name), and SQLite never
            # finds a TEXT equal to a BLOB; CAST gives a TEXT's UTF-8 bytes.
            whole, prefix = name_bytes(path), name_bytes(path + "/")
            where += (" AND (CAST(path AS BLOB) = ?"
                      " OR substr(CAST(path AS BLOB), 1, ?) = ?)")
            args += [whole, len(prefix), prefix]
        cur = self._db.execute(
            f"SELECT *, {EVENT_BYTES_SQL} AS bytes FROM events WHERE {where}"
            " ORDER BY id DESC LIMIT ?", (*args, limit))
        rows: list[sqlite3.Row] = []
        total, complete = 0, True
        for row in cur:                  # newest first, read only as far as the budget goes
            total += row["bytes"]
            if max_bytes is not None and rows and total > max_bytes:
                complete = False
                break
            rows.append(row)
        cur.close()
        return [event_row_to_dict(r) for r in reversed(rows)], complete


def event_row_to_dict(row) -> dict:
    return {"id": row["id"], "time_ns": row["time_ns"], "kind": row["kind"],
            "node": row["node"],
            "path": None if row["path"] is None else loaded_name(row["path"]),
            "uid": row["uid"], "pid": row["pid"],
            "detail": json.loads(row["detail"])}
