"""Many creates in one registry commit (issue 26; docs/protocol.md, "Many objects at once").

A batch's creates that need no keeper call of their own (a small allocation packed in its
owner's slab, which the keeper holds already, or a transient one) run as parts of one
change: one commit, and one fsync when any is durable, for a slice of items instead of one
each; the fsync runs on a worker thread while the loop serves the others. Each item is a
part (Journal.part): its error takes back only its own statements and in-memory steps. A
failed commit takes back the whole change, every item of it, and each of them answers that
error. The answer goes out after the fsync, so an item answered `ok` durable is on disk.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpumemctl.protocol.defaults import FILE_MODE

from ..core.creation import Creation, NewAllocation, Request
from ..core.describe import describe
from ..core.journal import Journal
from ..core.permissions import Credentials
from ..core.sessions import Session
from ..registry.store import DeferredSync

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


class ManyVerbs:
    def __init__(self, journal: Journal, creation: Creation):
        self.journal = journal
        self.creation = creation

    @contextlib.contextmanager
    def group(self) -> Iterator[DeferredSync]:
        """One change for many parts; its commit is durable when any part is. The fsync
        that makes it so is the caller's: it runs the yielded DeferredSync's sync(), off
        the event loop, before it answers (Registry.deferring_sync)."""
        with self.journal.registry.deferring_sync() as deferred:
            with self.journal.change(durable=False, batch=True):
                yield deferred

    def create(self, path: str, cred: Credentials, *, size: int, durable: bool = False,
               mode: int = FILE_MODE, device: str | None = None, ecc: str | None = None,
               session: Session | None = None, metadata: dict | None = None
               ) -> NodeInfo | None:
        """`create` as a part of the open group. None, having done nothing, when it would
        need more than a part may do: a keeper deposit of its own (a durable allocation
        with memory of its own), or an existing name (exist_ok's checks may make it
        durable): the caller runs NameVerbs.create for it after the group."""
        request = Request(size, durable, mode, device, ecc, False, session, metadata)
        new = self.creation.check(path, cred, request)
        # new.durable: asked for, or its directory's durable default (issue 27)
        if not isinstance(new, NewAllocation) or (new.durable and
                                                  not self.creation.packed(new)):
            return None
        with self.journal.part():
            alloc = self.creation.make(new, path, cred, request)
            # make() frees its memory when it fails; a commit failing later must too
            self.journal.on_rollback(lambda: self.creation.custody.free(alloc))
            return describe(alloc, holders=True)
