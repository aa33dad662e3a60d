"""An in-process stand-in for the keeper, so the unit tier starts no keeper process.

Two parts, as in the real thing:
- `KeptFds` is what the keeper process holds: its own copies (dup) of the fds deposited, and
  each deposit's meta. It outlives every daemon core built on it, as the keeper process outlives
  every gpumemd, so a unit test that "restarts" the core over it gets the memory back;
- `InProcessKeeper` is one daemon's link to it, with the interface of daemon/keeper/link.py's
  ProcessKeeper (what custody, adoption and the checker call). A test may patch a method of one
  link (to crash at a step) without the next core inheriting the patch.

Not a mock: deposit, withdraw and fetch really hold, drop and hand back fds, and meta goes
through JSON as on the keeper's socket. The process-only part (main.py's watch socket and
the probe that follows a stall) is left out: the unit tier never runs that loop, and the
integration tier runs it on the real keeper (tests/integration/test_keeper_stall.py).
"""
from __future__ import annotations

import json
import os

from daemon.keeper.link import KeeperGone


class KeptFds:
    """The keeper's holdings: key -> (its own fds, meta). `running` is False before the first
    link starts it and after a shutdown (the process exited, closing what it held)."""

    def __init__(self):
        self.kept: dict[int, tuple[list[int], dict]] = {}
        self.running = False

    def put(self, key: int, fds: list[int], meta: dict) -> None:
        """Keep copies of `fds` under `key`, replacing what was kept there (the caller keeps
        its own fds, as after sending them over the socket)."""
        copies = [os.dup(fd) for fd in fds]
        self.drop(key)
        self.kept[key] = (copies, json.loads(json.dumps(meta)))

    def drop(self, key: int) -> bool:
        old = self.kept.pop(key, None)
        for fd in old[0] if old else ():
            os.close(fd)
        return old is not None

    def copies(self) -> dict[int, list[int]]:
        """New fds for everything kept, by key; the keeper keeps its own."""
        return {key: [os.dup(fd) for fd in fds] for key, (fds, _) in self.kept.items()}

    def stop(self) -> None:
        for key in list(self.kept):
            self.drop(key)
        self.running = False


class InProcessKeeper:
    """One manager's link to a KeptFds (ProcessKeeper's interface)."""

    kind = "process"
    keeps_meta = True
    stalled = False           # nothing here can stop answering

    def __init__(self, holdings: KeptFds):
        self.holdings = holdings
        self.pid = os.getpid()

    def _held(self) -> KeptFds:
        if not self.holdings.running:
            raise KeeperGone("not connected to the keeper: it is not running")
        return self.holdings

    def ensure_running(self) -> bool:
        """Start the keeper if it is not running; True when it had to be started."""
        started = not self.holdings.running
        self.holdings.running = True
        return started

    def deposit(self, key: int, fds: list[int], meta: dict) -> None:
        self._held().put(key, fds, meta)

    def deposit_begin(self, key: int, fds: list[int], meta: dict) -> None:
        self.deposit(key, fds, meta)          # answered at once: nothing left to wait for

    def withdraw(self, key: int) -> None:
        self._held().drop(key)

    def fetch_all(self) -> dict[int, list[int]]:
        return self._held().copies()

    def keys(self) -> list[int]:
        return list(self._held().kept)

    def entries(self) -> dict[int, dict] | None:
        return {key: meta for key, (_, meta) in self._held().kept.items()}

    def info(self) -> dict:
        if not self.holdings.running:
            return {"kind": self.kind, "alive": False, "error": "the keeper is not running"}
        kept = self.holdings.kept.values()
        return {"kind": self.kind, "alive": True, "pid": self.pid, "held": len(kept),
                "fds": sum(len(fds) for fds, _ in kept), "socket": None}

    def watch_socket(self):
        return None           # as SystemdFdStore: no process whose death could be watched

    def shutdown(self) -> None:
        self._held().stop()

    def close(self) -> None:
        """Drop this link; the holdings stay, as the keeper process does."""
