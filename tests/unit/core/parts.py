"""What the tests of tests/unit/core/ build layers with (the fixtures are in conftest.py):
credentials, nodes made in a namespace as its callers make them, the host backend that frees
what a test left, and a registry connection whose n-th writing statement fails as on a full
disk. Each core layer is built by its own constructor in the test itself, never through
daemon.compose."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from daemon.backends.host import HostBackend, HostBuffer
from daemon.core.namespace import Namespace
from daemon.core.nodes import Allocation, Directory
from daemon.core.permissions import Credentials
from daemon.registry import Registry
from tests.registryfaults import FailingConnection
from tests.sizes import MiB

ROOT = Credentials(pid=os.getpid(), uid=0, gid=0)
ALICE = Credentials(pid=os.getpid(), uid=1000, gid=1000)
BOB = Credentials(pid=os.getpid(), uid=1001, gid=1001)


class TrackedHostBackend(HostBackend):
    """The host backend, which also remembers the buffers it holds so that a test's
    teardown frees what the test left (a memfd has no finaliser)."""

    def __init__(self, limit: int | None = None):
        super().__init__(limit=limit)
        self.live: set[HostBuffer] = set()

    def allocate(self, capacity: int, device: str, label: str) -> HostBuffer:
        buf = super().allocate(capacity, device, label)
        self.live.add(buf)
        return buf

    def adopt(self, fds: list[int], capacity: int, device: str) -> HostBuffer:
        buf = super().adopt(fds, capacity, device)
        self.live.add(buf)
        return buf

    def free(self, buf: HostBuffer) -> None:
        super().free(buf)
        self.live.discard(buf)

    def free_all(self) -> None:
        for buf in list(self.live):
            self.free(buf)


# ---- nodes, made as the layers above the namespace make them ---------------------------------
def mkdir(ns: Namespace, parent: Directory, name: str, cred: Credentials = ROOT,
          mode: int = 0o755) -> Directory:
    with ns.journal.change(durable=False):
        return ns.insert_node(Directory, parent, name, cred, mode)


def allocation(ns: Namespace, parent: Directory, name: str, cred: Credentials = ROOT, *,
               backend: HostBackend | None = None, size: int = MiB, ecc: str = "none",
               durable: bool = False, mode: int = 0o644) -> Allocation:
    """A ready allocation with its row; with `backend`, its memory (no parity: the test
    asks integrity for that); without, a pending one of size 0."""
    fields: dict = dict(size=0, capacity=None, device=None, durable=durable,
                        state="pending", ecc=ecc)
    if backend is not None:
        dev = backend.device(None)
        capacity = -(-size // dev.granularity) * dev.granularity
        fields.update(size=size, capacity=capacity, device=dev.uuid, state="ready",
                      buffer=backend.allocate(capacity, dev.uuid, label=name))
    with ns.journal.change(durable=durable):
        return ns.insert_node(Allocation, parent, name, cred, mode, **fields)


def row(registry: Registry, node_id: int) -> dict | None:
    """The node's registry row, as a dict (None: there is none)."""
    found = registry.db.execute("SELECT * FROM nodes WHERE id = ?", (node_id,)).fetchone()
    return dict(found) if found is not None else None


def events(registry: Registry, kind: str | None = None) -> list[dict]:
    """The event log's rows (of `kind`), oldest first."""
    rows = registry.db.execute("SELECT * FROM events ORDER BY id").fetchall()
    return [dict(r) for r in rows if kind is None or r["kind"] == kind]


@contextlib.contextmanager
def failing(registry: Registry, at: int | None) -> Iterator[FailingConnection]:
    """Inside: the registry's `at`-th writing statement fails (None: none does, the
    statements are counted)."""
    conn = FailingConnection(registry.db, at)
    registry.db = conn  # type: ignore[assignment]
    try:
        yield conn
    finally:
        registry.db = conn._db


def statements(registry: Registry, action) -> int:
    """How many writing statements (COMMIT included) `action()` runs."""
    with failing(registry, None) as conn:
        action()
    return conn.count
