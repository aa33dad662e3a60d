"""The journal: the unit of work over the registry (docs/design.md, "Architecture").

One `change()` is one registry transaction with an undo log beside it. Every in-memory step of
the change (an entry linked into or out of a directory, a field of a node, a deposit with the
keeper) registers how to take itself back (`on_rollback`, `keep`); when any statement or the
COMMIT fails, the undo log runs newest first, so memory, tree, registry and keeper agree again
and the caller gets one clear error (docs/durability.md, "A full state disk"). Events are
appended to the registry's log inside the transaction and published to the observers only
after it committed; a rolled-back change publishes nothing.

Observers: `observing(on_event, on_change)` registers a socket stream for committed events and
for nodes a monitor should redraw (`node_changed`). The journal knows nothing of allocations,
the backend or the keeper: those layers hand it their undo steps.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpumemctl.protocol import GpumemError, InternalError, NoMemory

from ..registry import Registry
from .events import LINE_PATH_LIMIT, LineBudget, bound_detail, cut
from .permissions import administrative_uid

log = logging.getLogger("gpumemd.manager")      # the event lines keep their logger name


class Journal:
    def __init__(self, registry: Registry):
        self.registry = registry
        # Told of every committed event: on_event(event) (socket `events -f`, `subscribe`).
        self.subscribers: set[Callable[[dict], None]] = set()
        # Told of every node a monitor should redraw (holders, state, size, damage, seal,
        # names), logged as an event or not: on_change(node). The socket server's
        # `subscribe` coalesces these per subscriber; they cost a set test while nobody
        # listens. See node_changed.
        self.change_listeners: set[Callable[[Any], None]] = set()
        self.line_budget = LineBudget(administrative_uid)    # `event` lines per user
        self._pending_events: list[dict] = []
        self._pending_nodes: list[Any] = []     # nodes of those events, for node_changed
        # How to take back each in-memory change of the open transaction, newest last.
        self._undo_log: list[Callable[[], None]] = []
        self._after_commit: list[Callable[[], object]] = []   # on_commit's steps
        # Steps each outer change runs first, inside it: rows owed by work done outside any
        # change (daemon/core/arenas.py's span rows), written with the next commit.
        self.owed_steps: list[Callable[[], None]] = []

    # ---- the unit of work ---------------------------------------------------------------
    @property
    def in_change(self) -> bool:
        return self.registry.in_transaction

    @contextlib.contextmanager
    def change(self, *, durable: bool, batch: bool = False) -> Iterator[None]:
        """One atomic change. `durable`: fsync at commit (it touches durable allocations).
        `batch`: it concerns only transient allocations (gone after any restart), so it may
        wait for the registry's group commit (Registry.transaction). Nested changes join the
        outer one; only the outer one rolls back memory and publishes."""
        outer = not self.in_change
        if outer:
            self._undo_log = []
        try:
            with self.registry.transaction(durable=durable, batch=batch):
                if outer:
                    for owed in self.owed_steps:
                        owed()
                yield
        except BaseException as exc:
            if outer:
                self._pending_events.clear()
                self._pending_nodes.clear()
                self._after_commit.clear()
                self._roll_back_memory()
                if isinstance(exc, sqlite3.Error):
                    raise self._registry_failed(exc) from exc
            raise
        if outer:
            self._undo_log = []
            events, self._pending_events = self._pending_events, []
            nodes, self._pending_nodes = self._pending_nodes, []
            for event in events:
                self._publish(event)
            for node in nodes:          # after the events: a monitor reads them first
                self._notify_changed(node)
            after, self._after_commit = self._after_commit, []
            for step in after:
                step()

    @contextlib.contextmanager
    def part(self) -> Iterator[None]:
        """Inside an open change: a part that fails alone. Its statements and in-memory
        steps are taken back and its events dropped when it raises; the change goes on and
        commits the other parts (a batch's items sharing one commit: daemon/server/batch.py).
        Its changes are only as final as the commit that ends the whole change."""
        if not self.in_change:
            raise RuntimeError("a part needs an open change")
        marks = (len(self._undo_log), len(self._pending_events), len(self._pending_nodes),
                 len(self._after_commit))
        try:
            with self.registry.savepoint():
                yield
        except BaseException:
            undo = self._undo_log[marks[0]:]
            del self._undo_log[marks[0]:]
            del self._pending_events[marks[1]:]
            del self._pending_nodes[marks[2]:]
            del self._after_commit[marks[3]:]
            for step in reversed(undo):
                try:
                    step()
                except Exception:
                    log.exception("rolling back an in-memory change failed")
            raise

    def on_commit(self, step: Callable[[], object]) -> None:
        """Run `step` once the open change has committed (now, if none is open); never if
        it rolls back."""
        if not self.in_change:
            step()
        elif step not in self._after_commit:
            self._after_commit.append(step)

    def on_rollback(self, step: Callable[[], None]) -> None:
        """Register how to take back an in-memory change made inside a change()."""
        if self.in_change:
            self._undo_log.append(step)

    def keep(self, obj: object, *attrs: str) -> None:
        """Before changing these attributes inside a change(): restore them on rollback."""
        saved = [(attr, getattr(obj, attr)) for attr in attrs]

        def restore() -> None:
            for attr, value in saved:
                setattr(obj, attr, value)
        self.on_rollback(restore)

    def _roll_back_memory(self) -> None:
        """The registry rolled back: take back every in-memory change of the transaction,
        newest first. One failing step does not stop the others."""
        undo, self._undo_log = self._undo_log, []
        for step in reversed(undo):
            try:
                step()
            except Exception:
                log.exception("rolling back an in-memory change failed")

    def _registry_failed(self, exc: sqlite3.Error) -> GpumemError:
        """A registry statement or its commit failed (a full state disk, an I/O error): the
        change was rolled back whole, and the client hears so in one line. Service goes on
        by itself once the registry can be written again. A full disk is no bug: it is
        out of space, exit 7 (ENOSPC), as a full fd store or device is (issue 24)."""
        where = os.path.dirname(self.registry.path) or "."
        log.warning("a change was rolled back: the registry could not be written: %s", exc)
        if "full" in str(exc):
            return NoMemory(f"no space left on the state disk: the registry could not record "
                            f"the change ({exc}); nothing was changed: free space in {where}",
                            details={"errno": "ENOSPC"})
        return InternalError(f"the registry could not record the change ({exc}); nothing "
                             "was changed", details={"errno": "EIO"})

    # ---- events ---------------------------------------------------------------------------
    def event(self, kind: str, node: Any, cred: Any, /, **detail: Any) -> None:
        """Record an event in the open change; it is published once that commits. `node`
        (a daemon.nodes.Node or None) and `cred` (Credentials or None) say what and who. The
        first three are positional-only: `detail` may come from a client (`close`'s
        `written`), and a key named like them must reach bound_detail, not clash."""
        now = time.time_ns()
        path = node.path if node is not None else None
        detail = bound_detail(kind, detail)       # schema and size (daemon/core/events.py)
        event_id = self.registry.event_log.add(
            kind, node.id if node else None, path, cred.uid if cred else None,
            cred.pid if cred else None, detail, now)
        self._pending_events.append({
            "id": event_id, "time_ns": now, "kind": kind, "node": node.id if node else None,
            "path": path, "uid": cred.uid if cred else None,
            "pid": cred.pid if cred else None, "detail": detail})
        if node is not None:
            self.node_changed(node)

    def note(self, kind: str, /, **detail: Any) -> None:
        """An event that concerns no node, in a change of its own."""
        with self.change(durable=False):
            self.event(kind, None, None, **detail)

    def node_changed(self, node: Any) -> None:
        """Tell the change listeners that a monitor showing `node` should redraw it. Called
        for every event about a node once it committed and directly for the changes no event
        records: holders added or dropped, `unsealed` set by attach, the size grown by a
        write within the capacity, the entries of a directory. A notice for a change that
        then rolls back is harmless (a redraw). Inside a change the notice waits for its
        commit, so it follows the change's events."""
        if not self.change_listeners:
            return
        if self.in_change:
            self._pending_nodes.append(node)
        else:
            self._notify_changed(node)

    def _notify_changed(self, node: Any) -> None:
        for listener in list(self.change_listeners):
            listener(node)

    def _publish(self, event: dict) -> None:
        """Hand a committed event to the subscribers, and log it: exactly one line at info
        per event-log entry (names may hold newlines and ESCs: the log's formatter escapes
        every record whole, daemon/logs.py), within each user's LineBudget."""
        if self.line_budget.take(event["uid"]):
            self._log_event(event)
        for callback in list(self.subscribers):
            callback(event)

    def _log_event(self, event: dict) -> None:
        uid = event["uid"]
        if left_out := self.line_budget.left_out(uid):
            log.info("%d event lines of uid %d were not logged (more than %d a second; the "
                     "events are in the event log)", left_out, uid,
                     LineBudget.LINES_PER_SECOND)
        who = f" uid={uid} pid={event['pid']}" if uid is not None else ""
        detail = " ".join(f"{k}={v}" for k, v in event["detail"].items())
        path = cut(event["path"] or "-", LINE_PATH_LIMIT)     # details are bounded already
        log.info("event %s %s%s%s", event["kind"], path, who,
                 " " + detail if detail else "")

    # ---- observers and the log ------------------------------------------------------------
    @contextlib.contextmanager
    def observing(self, on_event: Callable[[dict], None],
                  on_change: Callable[[Any], None] | None = None) -> Iterator[None]:
        """While inside: `on_event(event)` for each event once it committed, and, when
        given, `on_change(node)` for each node a monitor should redraw (node_changed)."""
        self.subscribers.add(on_event)
        if on_change is not None:
            self.change_listeners.add(on_change)
        try:
            yield
        finally:
            self.subscribers.discard(on_event)
            if on_change is not None:
                self.change_listeners.discard(on_change)

    def events(self, *, since: int, limit: int, path: str | None = None,
               uid: int | None = None, max_bytes: int | None = None,
               administrator: bool = False) -> tuple[list[dict], bool]:
        """Logged events after `since`, oldest first, at most `limit` (the newest) and at
        most `max_bytes` of detail and path text; with `path`, those at or under it; with
        `uid`, only those that user may see (events.visible_to). And whether none was left
        out for want of bytes (registry.event_log.page)."""
        return self.registry.event_log.page(since, limit, path, uid, max_bytes, administrator)

    def last_event_id(self) -> int:
        """The id of the newest logged event (0 when the log is empty)."""
        return self.registry.event_log.last_id()
