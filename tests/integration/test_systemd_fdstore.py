"""gpumemd under systemd: sd_notify and the file descriptor store instead of the keeper.

When $NOTIFY_SOCKET is set the daemon reports READY=1 / STOPPING=1 to the service manager and
keeps the fds of durable allocations in systemd's fd store (FDSTORE=1 + FDNAME=a<id>.<n>;
FDSTOREREMOVE=1 when they go). After a restart systemd hands the stored fds back the way
socket activation does: numbered from 3, $LISTEN_FDS=count, $LISTEN_FDNAMES=colon-separated
names, $LISTEN_PID=the service's own pid. No keeper process is started.

`FakeServiceManager` plays systemd's part: a datagram socket in the daemon's temp directory,
read by a thread with recvmsg (SCM_RIGHTS for the fds, SCM_CREDENTIALS for the sender's pid,
as systemd checks NotifyAccess=main), keeping an fd store with systemd's semantics.
`start_with_fds()` restarts the daemon with the store's contents, as systemd does.
"""
from __future__ import annotations

import array
import mmap
import os
import signal
import socket
import struct
import subprocess
import threading

import pytest

from tests.harness import child_env, script_argv, wait_for

pytestmark = pytest.mark.slabs_off   # per-allocation keeper deposits and descriptors

MiB = 1 << 20
GRANULARITY = 2 * MiB


class FakeServiceManager:
    """The sd_notify side of systemd, with an fd store (FileDescriptorStoreMax= > 0)."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.05)
        self.lock = threading.Lock()
        self.messages: list[dict] = []           # every notification, parsed, in order
        self.store: list[tuple[str, int]] = []   # the fd store: (name, fd), in arrival order
        self.errors: list[str] = []
        self._running = True
        self._thread = threading.Thread(target=self._serve, name="fake-systemd", daemon=True)
        self._thread.start()

    # ---- receiving ----------------------------------------------------------------------
    def _serve(self) -> None:
        ancillary_space = socket.CMSG_SPACE(253 * 4) + socket.CMSG_SPACE(struct.calcsize("3i"))
        while self._running:
            try:
                data, ancdata, flags, _addr = self.sock.recvmsg(
                    65536, ancillary_space, socket.MSG_CMSG_CLOEXEC)
            except TimeoutError:
                continue
            except OSError:
                return
            fds: list[int] = []
            pid = None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(payload[:len(payload) - len(payload) % arr.itemsize])
                    fds.extend(arr)
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", payload[:12])[0]
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                self.errors.append(f"truncated notification (flags {flags:#x})")
            self._handle(data.decode(errors="replace"), fds, pid)

    def _handle(self, text: str, fds: list[int], pid: int | None) -> None:
        fields = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
        message = {"text": text, "fields": fields, "pid": pid, "nfds": len(fds)}
        with self.lock:
            self.messages.append(message)
            if fields.get("FDSTORE") == "1":
                # systemd: the fds are stored under FDNAME (default "stored").
                name = fields.get("FDNAME", "stored")
                self.store.extend((name, fd) for fd in fds)
                fds = []
            if fields.get("FDSTOREREMOVE") == "1":
                # systemd: drop (and close) every stored fd of that name.
                name = fields.get("FDNAME")
                for entry in [e for e in self.store if e[0] == name]:
                    self.store.remove(entry)
                    os.close(entry[1])
        for fd in fds:                 # fds sent without FDSTORE=1 are closed, as systemd does
            os.close(fd)

    # ---- looking at what arrived ----------------------------------------------------------
    def with_field(self, key: str, value: str | None = None) -> list[dict]:
        with self.lock:
            return [m for m in self.messages if key in m["fields"]
                    and (value is None or m["fields"][key] == value)]

    def wait_field(self, key: str, value: str | None = None, count: int = 1,
                   timeout: float = 10.0) -> list[dict]:
        return wait_for(lambda: len(self.with_field(key, value)) >= count
                        and self.with_field(key, value), timeout,
                        what=f"{count} notification(s) with {key}={value or '*'}")

    def stored(self) -> list[tuple[str, int]]:
        with self.lock:
            return list(self.store)

    def names(self) -> list[str]:
        return [name for name, _ in self.stored()]

    def close(self) -> None:
        self._running = False
        self._thread.join(5)
        self.sock.close()
        with self.lock:
            for _, fd in self.store:
                os.close(fd)
            self.store.clear()


# Runs in the child between fork and the daemon's exec, like systemd's own service setup.
# Popen(pass_fds=...) keeps the fds at whatever numbers they have in the test process; this
# moves them to 3, 4, ... (first out of the way, above the target range, since a source fd may
# already sit inside it), sets LISTEN_PID to its own pid and execs the daemon. exec keeps the
# pid, so LISTEN_PID names the daemon, which is what sd_listen_fds() (and daemon/systemd.py)
# require. LISTEN_FDS and LISTEN_FDNAMES come from the environment the test prepared. A
# preexec_fn cannot do this: Popen has built the child's environment before it runs, and the
# dup2s could land on Popen's own error pipe.
WRAPPER = """
import fcntl, os, sys
sources = [int(fd) for fd in os.environ.pop("FAKE_SYSTEMD_FDS").split(",") if fd]
count = len(sources)
parked = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + count) for fd in sources]
for fd in sources:
    os.close(fd)
for i, fd in enumerate(parked):
    os.dup2(fd, 3 + i, inheritable=True)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.execv(sys.argv[1], sys.argv[1:])
"""


def start_with_fds(daemon, entries: list[tuple[str, int]]) -> None:
    """Start `daemon` as systemd restarts a service that has an fd store."""
    fds = [fd for _, fd in entries]
    env = child_env({**daemon.extra_env, "FAKE_SYSTEMD_FDS": ",".join(map(str, fds)),
                "LISTEN_FDS": str(len(fds)),
                "LISTEN_FDNAMES": ":".join(name for name, _ in entries)})
    command = script_argv("gpumemd") + ["--backend", daemon.backend, "--socket", daemon.socket,
                                 "--state-dir", daemon.state_dir, "--log-level", "debug",
                                 *daemon.extra_args]
    with open(daemon.log_path, "ab") as log:
        daemon.proc = subprocess.Popen([command[0], "-c", WRAPPER, *command], pass_fds=fds,
                                       stdout=log, stderr=log, env=env)
    daemon.wait_ready()


@pytest.fixture
def systemd_daemon(daemon_factory):
    """An unstarted Daemon whose $NOTIFY_SOCKET is a FakeServiceManager in its directory."""
    d = daemon_factory(start=False)
    manager = FakeServiceManager(os.path.join(d.base, "notify.sock"))
    d.extra_env["NOTIFY_SOCKET"] = manager.path
    yield d, manager
    d.cleanup()
    manager.close()
    assert not manager.errors, manager.errors


def _assert_no_keeper(d) -> None:
    assert not os.path.exists(os.path.join(d.state_dir, "keeper.pid")), \
        "a keeper process was started although systemd's fd store is in use"
    assert not os.path.exists(os.path.join(d.state_dir, "keeper.sock"))
    assert d.keeper_pid() is None


def _stop(d, manager, stops_before: int = 0) -> None:
    assert d.stop(signal.SIGTERM) == 0, d.log()[-3000:]
    stopping = manager.wait_field("STOPPING", "1", count=stops_before + 1)
    assert stopping[-1]["pid"] == d.proc.pid


def _pattern(n: int, seed: int) -> bytes:
    block = bytes((i * 131 + seed) % 251 for i in range(4096))
    return (block * (n // len(block) + 1))[:n]


def test_ready_stopping_and_no_keeper(systemd_daemon):
    d, manager = systemd_daemon
    d.start()
    ready = manager.wait_field("READY", "1")
    assert len(ready) == 1 and ready[0]["pid"] == d.proc.pid   # NotifyAccess=main holds
    assert ready[0]["fields"].get("STATUS", "").startswith("serving ")
    with d.client() as c:
        keeper = c.status()["keeper"]
        assert keeper["kind"] == "systemd" and keeper["socket"] == manager.path
        assert c.check()["clean"] is True
    _assert_no_keeper(d)
    _stop(d, manager)
    assert manager.messages.index(ready[0]) < manager.messages.index(
        manager.with_field("STOPPING", "1")[0])
    _assert_no_keeper(d)


@pytest.mark.parametrize("hard", [True, False], ids=["kill9", "sigterm"])
def test_durable_memory_survives_restart_in_fd_store(systemd_daemon, hard):
    d, manager = systemd_daemon
    d.start()
    manager.wait_field("READY", "1")
    size = 3 * MiB
    data = _pattern(size, seed=7)
    with d.client() as c:
        c.create("scratch", MiB)                         # transient: never stored
        # ECC off: one fd per allocation keeps this about the store (with ECC the parity
        # region is stored beside it as .1: test_ecc.py)
        info = c.create("models/w", size, durable=True, ecc="none")
        name = f"a{info['id']}.0"
        stores = manager.wait_field("FDSTORE", "1")
        assert [m["fields"].get("FDNAME") for m in stores] == [name]
        assert stores[0]["nfds"] == 1 and stores[0]["pid"] == d.proc.pid
        assert manager.names() == [name]
        c.write("models/w", data)
        c.write("scratch", b"gone after restart")
        assert c.check()["clean"] is True
    _assert_no_keeper(d)

    # The stored fd is the allocation's memory itself.
    (_, stored_fd), = manager.stored()
    assert os.fstat(stored_fd).st_size == info["capacity"] == 2 * GRANULARITY
    with mmap.mmap(stored_fd, info["capacity"], mmap.MAP_SHARED, mmap.PROT_READ) as m:
        assert m[:size] == data

    if hard:
        d.kill9()
        assert not manager.with_field("STOPPING")       # a crash says nothing
    else:
        _stop(d, manager)
    assert manager.names() == [name]                     # the store outlives the daemon

    start_with_fds(d, manager.stored())
    ready = manager.wait_field("READY", "1", count=2)
    assert ready[-1]["pid"] == d.proc.pid
    with d.client() as c:
        assert c.read("models/w") == data
        entries = {e["path"]: e for e in c.ls("", recursive=True)}
        assert set(entries) == {"models", "models/w"}    # the transient is gone
        w = entries["models/w"]
        assert (w["id"], w["size"], w["durable"], w["state"]) == \
            (info["id"], size, True, "ready")
        assert c.check()["clean"] is True
        keeper = c.status()["keeper"]
        assert (keeper["kind"], keeper["held"], keeper["fds"]) == ("systemd", 1, 1)

        removes_before = len(manager.with_field("FDSTOREREMOVE", "1"))
        assert c.remove("models/w") == ["models/w"]
        removes = manager.wait_field("FDSTOREREMOVE", "1", count=removes_before + 1)
        assert removes[-1]["fields"].get("FDNAME") == name
        assert removes[-1]["pid"] == d.proc.pid
        assert manager.stored() == []
        assert c.check()["clean"] is True

    _stop(d, manager, stops_before=0 if hard else 1)
    _assert_no_keeper(d)


def test_durability_changes_store_and_remove_fds(systemd_daemon):
    d, manager = systemd_daemon
    d.start()
    manager.wait_field("READY", "1")
    with d.client() as c:
        info = c.create("t", 4096, ecc="none")
        name = f"a{info['id']}.0"
        c.set_durable("t", True)
        stores = manager.wait_field("FDSTORE", "1")
        assert stores[0]["fields"].get("FDNAME") == name and manager.names() == [name]
        assert c.check()["clean"] is True
        c.set_durable("t", False)
        removes = manager.wait_field("FDSTOREREMOVE", "1")
        assert removes[0]["fields"].get("FDNAME") == name
        assert manager.stored() == []
        assert c.check()["clean"] is True
    _stop(d, manager)
    _assert_no_keeper(d)


def test_orphan_in_fd_store_is_removed_at_start(systemd_daemon):
    """A crash between FDSTORE and the registry commit leaves an fd the registry does not
    know: the next start frees it and tells systemd to drop it."""
    d, manager = systemd_daemon
    d.start()
    manager.wait_field("READY", "1")
    _stop(d, manager)
    orphan = os.memfd_create("orphan", os.MFD_CLOEXEC)
    os.ftruncate(orphan, GRANULARITY)
    with manager.lock:
        manager.store.append(("a999.0", orphan))
    start_with_fds(d, manager.stored())
    manager.wait_field("READY", "1", count=2)
    removes = manager.wait_field("FDSTOREREMOVE", "1")
    assert removes[0]["fields"].get("FDNAME") == "a999.0"
    assert manager.stored() == []
    with d.client() as c:
        assert c.ls("", recursive=True) == []
        assert c.check()["clean"] is True
    _stop(d, manager, stops_before=1)
    _assert_no_keeper(d)


NO_MEMORY = 7


def test_deposits_past_fd_store_max_are_refused(systemd_daemon):
    """systemd closes an fd sent past FileDescriptorStoreMax= and tells the service nothing:
    durable memory would silently not survive a restart. gpumemd counts what the store
    holds and refuses, before sending anything, what would not fit (exit 7). The limit is
    $FDSTORE, which systemd 254+ sets to the unit's FileDescriptorStoreMax=."""
    d, manager = systemd_daemon
    d.extra_env["FDSTORE"] = "3"
    d.start()
    manager.wait_field("READY", "1")
    with d.client() as c:
        c.create("one", 4096, durable=True, ecc="none")        # 1 fd
        c.create("two", 4096, durable=True, ecc="rs")          # 2 fds: data and parity
        manager.wait_field("FDSTORE", "1", count=3)
        c.create("t", 4096, ecc="none")
        assert c.status()["keeper"]["max_fds"] == 3
    full = d.cli("create", "three", "--size", "4K", "--durable", "--ecc", "none")
    assert full.returncode == NO_MEMORY, full
    message = full.stderr.decode()
    for words in ("FileDescriptorStoreMax=3", "$FDSTORE", "holds 3", "systemctl edit"):
        assert words in message, message
    refused = d.cli("durable", "t")
    assert refused.returncode == NO_MEMORY and "FileDescriptorStoreMax=3" in \
        refused.stderr.decode(), refused
    assert len(manager.with_field("FDSTORE", "1")) == 3           # nothing more was sent
    assert len(manager.stored()) == 3
    with d.client() as c:
        entries = {e["path"]: e for e in c.ls("")}
        assert set(entries) == {"one", "two", "t"} and entries["t"]["durable"] is False
        assert c.check()["clean"] is True
        c.remove("one")                                          # frees one descriptor
        c.set_durable("t", True)
        assert len(manager.stored()) == 3
        assert c.check()["clean"] is True
    _stop(d, manager)


def test_fd_store_max_from_the_configuration_counts_what_systemd_passed_back(
        systemd_daemon, tmp_path):
    """systemd before 254 does not set $FDSTORE: the configuration's fd_store_max stands in
    for the unit's FileDescriptorStoreMax=. After a restart the fds systemd hands back count."""
    d, manager = systemd_daemon
    conf = tmp_path / "gpumemd.toml"
    conf.write_text("fd_store_max = 2\n")
    d.extra_args += ["--config", str(conf)]
    d.extra_env.pop("FDSTORE", None)
    d.start()
    manager.wait_field("READY", "1")
    with d.client() as c:
        c.create("a", 4096, durable=True, ecc="none")
        c.create("b", 4096, durable=True, ecc="none")
    _stop(d, manager)
    start_with_fds(d, manager.stored())
    manager.wait_field("READY", "1", count=2)
    full = d.cli("create", "c", "--size", "4K", "--durable", "--ecc", "none")
    assert full.returncode == NO_MEMORY, full
    assert "FileDescriptorStoreMax=2" in full.stderr.decode()
    assert "fd_store_max" in full.stderr.decode()
    with d.client() as c:
        assert {e["path"] for e in c.ls("")} == {"a", "b"}
        assert c.check()["clean"] is True
    _stop(d, manager, stops_before=1)
