"""How the daemon hands durable fds to a keeper and takes them back after a restart.

Two implementations of one small interface:
- `ProcessKeeper`: the keeper process of daemon/keeper/process.py, started detached on demand;
- `SystemdFdStore`: systemd's file descriptor store, used when $NOTIFY_SOCKET is set.
Keys are allocation ids (registry row ids, never reused).
"""
from __future__ import annotations

import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from gpumemctl.protocol import framing

from .. import systemd
from ..paths import open_own
from .process import NO_ROOM

# A keeper answers a call in well under a millisecond. One that takes seconds is stopped
# (SIGSTOP, a debugger) or starved; the daemon's event loop must not wait on it for long,
# since every client waits with it. Start-up (spawn, fetch of every fd) may take longer.
CALL_TIMEOUT = 3.0
START_TIMEOUT = 30.0
# Calls come from the event loop and from worker threads (a durable create's deposit runs
# on one, daemon/server/allocations.py). One call at a time goes over the connection; a
# call that finds another in flight waits this long for it, then says the keeper is busy:
# the loop never waits a stalled keeper's full timeout behind a worker.
QUEUE_WAIT = 0.25
# How long the loop waits for the answer to a call it may hand to a worker (call_begin):
# far above a keeper's normal answer time, far below what a client notices.
QUICK_WAIT = 0.02
# FileDescriptorStoreMax= of the unit gpumemd ships (systemd/gpumemd.service): the size of
# systemd's fd store assumed where systemd does not say it ($FDSTORE) and the configuration
# has no `fd_store_max` (daemon/config.py has the same default).
DEFAULT_FD_STORE_MAX = 4096


class KeeperGone(Exception):
    """The keeper died or cannot be reached."""


class FdStoreFull(Exception):
    """systemd's fd store has no room for a deposit: systemd would close the fds past
    FileDescriptorStoreMax= without a word, and the memory would not survive a restart.
    Nothing was sent."""


class KeeperFull(KeeperGone, FdStoreFull):
    """The keeper process refused a deposit: the fds would pass its open-file limit
    (daemon/keeper/process.py, KEEPER_SPARE). Nothing new is kept under the key; it is a limit, as
    FdStoreFull is, and the keeper is well."""


class KeeperStalled(KeeperGone):
    """The keeper did not answer in time. What it did with the unanswered request is not
    known, so calls are refused from then on (at once: one stall costs one request's
    timeout, not one per request) until the daemon has probed it back to life and
    reconciled what it holds (ServiceVerbs.reconcile_keeper)."""


class ProcessKeeper:
    kind = "process"
    keeps_meta = True          # a deposit's meta comes back (entries): extents can be told

    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "keeper.sock")
        self.pidfile = os.path.join(state_dir, "keeper.pid")
        self.logfile = os.path.join(state_dir, "keeper.log")
        self.sock: socket.socket | None = None
        self.pid: int | None = None
        self._next_id = 0
        self.stalled_since: float | None = None    # time.monotonic() of the last timeout
        self._lock = threading.Lock()              # one call at a time on self.sock

    @property
    def stalled(self) -> bool:
        return self.stalled_since is not None

    # ---- connection -------------------------------------------------------------------
    def _connect(self, timeout: float = CALL_TIMEOUT) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        sock.connect(self.path)
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            sock.close()
            raise KeeperGone(f"{self.path} is served by uid {uid}, not ours")
        return sock

    def ensure_running(self) -> bool:
        """Connect to the keeper, starting one if none answers. True when one was started."""
        self.close()
        self.stalled_since = None
        started = False
        try:
            self.sock = self._connect(START_TIMEOUT)
        except (FileNotFoundError, ConnectionRefusedError):
            self._spawn()
            self.sock = self._connect(START_TIMEOUT)
            started = True
        # SO_PEERCRED names the process that called listen(), which forked and exited.
        self.pid = self._call("hello")["pid"]
        self.sock.settimeout(CALL_TIMEOUT)
        return started

    def probe(self) -> socket.socket | None:
        """A fresh connection to a keeper that answers `hello` within CALL_TIMEOUT, or None.
        Blocks for up to that long, so the daemon runs it on a worker thread; it touches no
        state of this object."""
        try:
            sock = self._connect()
        except (OSError, KeeperGone):
            return None
        try:
            framing.send_frame(sock, {"id": 0, "op": "hello"})
            reply, fds = framing.recv_frame(sock, framing.MAX_RESPONSE_BYTES)
            framing.close_fds(fds)
            if reply.get("ok"):
                return sock
        except (OSError, EOFError, framing.ProtocolError):
            pass
        sock.close()
        return None

    def resume(self, sock: socket.socket) -> None:
        """Use a connection that probe() found answering; calls are allowed again."""
        with self._lock:
            self.close()
            self.sock, self.stalled_since = sock, None

    def _spawn(self) -> None:
        # Kept between runs; never opened through a symlink (paths.open_own).
        with os.fdopen(open_own(self.logfile, os.O_WRONLY | os.O_APPEND), "ab") as log:
            proc = subprocess.run(
                [sys.executable, "-m", "daemon.keeper", "--socket", self.path,
                 "--pidfile", self.pidfile, "--detach"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                close_fds=True, timeout=30, cwd="/", env=self._keeper_env())
        if proc.returncode != 0:
            raise KeeperGone(f"the keeper failed to start (exit {proc.returncode}); "
                             f"see {self.logfile}")

    @staticmethod
    def _keeper_env() -> dict:
        env = dict(os.environ)
        # The keeper must import our package from wherever the daemon did.
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"]
                                    if env.get("PYTHONPATH") else "")
        for var in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(var, None)
        return env

    def _call(self, op: str, fds: list[int] | None = None, **args) -> dict:
        self._acquire()
        try:
            self._send(op, fds, args)
            return self._answer(op, CALL_TIMEOUT)
        finally:
            self._lock.release()

    def call_begin(self, op: str, fds: list[int] | None = None,
                   **args) -> Callable[[], dict] | dict:
        """A call whose answer the event loop waits for only QUICK_WAIT (a keeper answers
        in well under a millisecond): the answer, or a function that waits for the rest of
        CALL_TIMEOUT, for a worker thread (it holds the connection until it returns)."""
        self._acquire()
        try:
            self._send(op, fds, args)
            assert self.sock is not None
            if select.select([self.sock], [], [], QUICK_WAIT)[0]:
                answer = self._answer(op, CALL_TIMEOUT)
                self._lock.release()
                return answer
        except BaseException:
            self._lock.release()
            raise

        def rest() -> dict:
            try:
                return self._answer(op, CALL_TIMEOUT - QUICK_WAIT)
            finally:
                self._lock.release()
        return rest

    def _acquire(self) -> None:
        if not self._lock.acquire(timeout=QUEUE_WAIT):
            raise KeeperStalled(f"the keeper (pid {self.pid}) is still busy with an earlier "
                                f"request after {QUEUE_WAIT} s; durable changes wait until it "
                                "answers")

    def _send(self, op: str, fds: list[int] | None, args: dict) -> None:
        if self.stalled_since is not None:
            waited = time.monotonic() - self.stalled_since
            raise KeeperStalled(f"the keeper (pid {self.pid}) has not answered for "
                                f"{waited:.0f} s; durable changes wait until it does")
        if self.sock is None:           # lost earlier: a keeper that answers again is reused
            try:
                self.sock = self._connect()
            except OSError as exc:
                raise KeeperGone(f"not connected to the keeper: {exc}") from None
        self._next_id += 1
        try:
            framing.send_frame(self.sock, {"id": self._next_id, "op": op, **args}, fds or [])
        except TimeoutError:
            self._stall(op)
        except OSError as exc:
            self.close()
            raise KeeperGone(f"lost the keeper: {exc}") from None

    def _answer(self, op: str, timeout: float) -> dict:
        assert self.sock is not None
        try:
            self.sock.settimeout(timeout)
            reply, extra = framing.recv_frame(self.sock, framing.MAX_RESPONSE_BYTES)
        except TimeoutError:
            self._stall(op)
        except (OSError, EOFError) as exc:
            self.close()
            raise KeeperGone(f"lost the keeper: {exc}") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(CALL_TIMEOUT)
        framing.close_fds(extra)
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if error.get("code") == NO_ROOM:
                raise KeeperFull(str(error.get("message")))
            raise KeeperGone(f"keeper refused {op}: {error}")
        return reply["result"]

    def _stall(self, op: str) -> NoReturn:
        self.close()
        self.stalled_since = time.monotonic()
        raise KeeperStalled(f"the keeper (pid {self.pid}) did not answer {op!r} within "
                            f"{CALL_TIMEOUT:.0f} s; durable changes wait until it does")

    # ---- the interface ----------------------------------------------------------------
    def deposit(self, key: int, fds: list[int], meta: dict) -> None:
        self._call("deposit", fds, key=str(key), meta=meta)

    def deposit_begin(self, key: int, fds: list[int], meta: dict) -> Callable[[], object] | None:
        """deposit() whose answer the loop waits for at most QUICK_WAIT (call_begin): None
        when done, else what waits for the rest (the fds are sent either way)."""
        rest = self.call_begin("deposit", fds, key=str(key), meta=meta)
        return rest if callable(rest) else None

    def withdraw(self, key: int) -> None:
        self._call("withdraw", key=str(key))

    def fetch_all(self) -> dict[int, list[int]]:
        """Every kept fd, by key (the keeper keeps its own copies)."""
        self._next_id += 1
        kept: dict[int, list[int]] = {}
        if self.sock is None:
            raise KeeperGone("not connected to the keeper")
        self.sock.settimeout(START_TIMEOUT)        # start-up: thousands of fds may come
        try:
            framing.send_frame(self.sock, {"id": self._next_id, "op": "fetch"})
            while True:
                reply, fds = framing.recv_frame(self.sock, framing.MAX_RESPONSE_BYTES)
                if "key" not in reply:
                    self.sock.settimeout(CALL_TIMEOUT)
                    return kept
                kept[int(reply["key"])] = fds
        except (OSError, EOFError) as exc:
            for fds in kept.values():
                framing.close_fds(fds)
            self.close()
            raise KeeperGone(f"lost the keeper while fetching: {exc}") from None

    def keys(self) -> list[int]:
        return [int(k["key"]) for k in self._call("list")["keys"]]

    def entries(self) -> dict[int, dict] | None:
        """The meta each key was deposited with (daemon/core/orphans.py reads its `registry`)."""
        return {int(k["key"]): k.get("meta") or {} for k in self._call("list")["keys"]}

    def info(self) -> dict:
        try:
            hello = self._call("hello")
        except KeeperGone as exc:
            return {"kind": self.kind, "alive": False, "error": str(exc)}
        return {"kind": self.kind, "alive": True, "pid": hello["pid"],
                "held": hello["held"], "fds": hello["fds"], "socket": self.path}

    def watch_socket(self) -> socket.socket:
        """A connection whose EOF tells that the keeper died."""
        sock = self._connect()
        framing.send_frame(sock, {"id": 0, "op": "watch"})
        return sock

    def shutdown(self) -> None:
        self._call("shutdown")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class SystemdFdStore:
    """systemd's fd store (FileDescriptorStoreMax= in the unit). The service manager keeps
    the fds across restarts of gpumemd and passes them back with LISTEN_FDS.

    systemd closes an fd sent past FileDescriptorStoreMax= and says nothing to the service
    (it only logs), so the store counts what it holds and refuses a deposit that would pass
    `limit` (FdStoreFull) before sending anything. `limit` is $FDSTORE where systemd sets it
    (254 and later), else the `fd_store_max` configuration key (docs/operations.md)."""
    kind = "systemd"
    keeps_meta = False         # names and fds only: memory of several extents is not kept
    stalled = False            # notifications are datagrams: nothing to wait for

    def __init__(self, limit: int, limit_from: str = "the configuration's fd_store_max"):
        self.held: dict[int, int] = {}   # key -> number of fds stored
        self.limit, self.limit_from = limit, limit_from
        self._passed: dict[str, list[int]] = systemd.listen_fds()

    @staticmethod
    def _name(key: int, index: int) -> str:
        return f"a{key}.{index}"

    def ensure_running(self) -> bool:
        return False

    def deposit(self, key: int, fds: list[int], meta: dict) -> None:
        self.require_room(key, len(fds))
        self.withdraw(key)
        for i, fd in enumerate(fds):
            systemd.notify(f"FDSTORE=1\nFDNAME={self._name(key, i)}", [fd])
        self.held[key] = len(fds)

    def deposit_begin(self, key: int, fds: list[int], meta: dict) -> None:
        """As ProcessKeeper's: the fd store answers nothing, so it is done at once."""
        self.deposit(key, fds, meta)

    def require_room(self, key: int, count: int) -> None:
        """FdStoreFull unless `count` fds under `key` (replacing what it holds) fit."""
        stored = sum(self.held.values())
        if stored - self.held.get(key, 0) + count <= self.limit:
            return
        raise FdStoreFull(
            f"systemd's fd store is full: it holds {stored} descriptors of durable memory, "
            f"and {count} more would pass FileDescriptorStoreMax={self.limit} (as "
            f"{self.limit_from} says), past which systemd drops them. Durable memory takes 1 "
            "descriptor an allocation of memory of its own (2 with parity of its own), and 1 "
            "a slab or parity arena; raise FileDescriptorStoreMax= "
            "with `systemctl edit gpumemd` (and fd_store_max in gpumemd.toml where systemd "
            "is older than 254), or make allocations transient")

    def withdraw(self, key: int) -> None:
        for i in range(self.held.pop(key, 0)):
            systemd.notify(f"FDSTOREREMOVE=1\nFDNAME={self._name(key, i)}")

    def fetch_all(self) -> dict[int, list[int]]:
        kept: dict[int, list[tuple[int, int]]] = {}
        for name, fds in self._passed.items():
            try:
                key_text, index_text = name[1:].split(".")
                key, index = int(key_text), int(index_text)
            except ValueError:
                framing.close_fds(fds)
                continue
            kept.setdefault(key, []).append((index, fds[0]))
            framing.close_fds(fds[1:])
        self._passed = {}
        result = {key: [fd for _, fd in sorted(pairs)] for key, pairs in kept.items()}
        self.held = {key: len(fds) for key, fds in result.items()}
        return result

    def keys(self) -> list[int]:
        return list(self.held)

    def entries(self) -> dict[int, dict] | None:
        """None: the fd store keeps no meta, only the fds and their names."""
        return None

    def info(self) -> dict:
        return {"kind": self.kind, "alive": True, "pid": None, "held": len(self.held),
                "fds": sum(self.held.values()), "max_fds": self.limit,
                "socket": systemd.notify_socket()}

    def watch_socket(self):
        return None

    def shutdown(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_keeper(state_dir: str, fd_store_max: int = DEFAULT_FD_STORE_MAX):
    """systemd's fd store under systemd, else the keeper process. `fd_store_max`: the
    configuration's word for the store's size, used where systemd does not say ($FDSTORE)."""
    if systemd.notify_socket():
        told = systemd.fd_store_max()
        if told is not None:
            return SystemdFdStore(told, "systemd's $FDSTORE")
        return SystemdFdStore(fd_store_max, "the configuration's fd_store_max: systemd "
                              "before 254 does not set $FDSTORE")
    return ProcessKeeper(state_dir)
