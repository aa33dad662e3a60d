"""Live change subscription (`subscribe`) and progress frames for long calls (`verify` and
`recover` with `progress`), against a real gpumemd on the host backend. docs/protocol.md."""
from __future__ import annotations

import os
import pty
import queue
import socket
import subprocess
import threading
import time

import pytest

from gpumemctl import Client
from gpumemctl.protocol import NotRunning, framing
from tests.harness import child_env, script_argv, wait_for
from tests.users import run_as

MiB = 1 << 20
COALESCE = 0.05          # daemon/server/streams.py COALESCE_SECONDS


class Collector:
    """Iterates a subscription on a thread; the test looks at what arrived so far."""

    def __init__(self, subscription):
        self.sub = subscription
        self.items: list[dict] = []
        self.ended: BaseException | str | None = None
        self._new = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for item in self.sub:
                self.items.append(item)
                self._new.put(None)
            self.ended = "stop"
        except BaseException as exc:   # noqa: BLE001 - the test looks at it
            self.ended = exc
        self._new.put(None)

    def wait(self, predicate, start: int = 0, timeout: float = 5.0, what: str = "an item"):
        """The index of the first item at or after `start` that matches."""
        deadline = time.monotonic() + timeout
        seen = start
        while True:
            items = self.items
            for i in range(seen, len(items)):
                if predicate(items[i]):
                    return i
            seen = len(items)
            left = deadline - time.monotonic()
            if left <= 0 or (self.ended is not None and seen == len(self.items)):
                raise AssertionError(f"no {what} within {timeout}s (ended: {self.ended!r}); "
                                     f"got {self.items[start:][-20:]}")
            try:
                self._new.get(timeout=min(left, 0.1))
            except queue.Empty:
                pass

    def settle(self, quiet: float = 0.4, timeout: float = 10.0) -> None:
        """Wait until nothing has arrived for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        count, since = len(self.items), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if len(self.items) != count:
                count, since = len(self.items), time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
        raise AssertionError("the stream never went quiet")


def changed_with(node_id: int):
    return lambda it: it["type"] == "changed" and node_id in it["nodes"]


def event_of(kind: str, path: str):
    return lambda it: it["type"] == "event" and it["event"]["kind"] == kind and \
        it["event"]["path"] == path


# ---- subscribe ---------------------------------------------------------------------------------

def test_subscriber_sees_events_and_holder_changes(daemon):
    with daemon.client() as sc, daemon.client() as c:
        sub = sc.subscribe()
        assert sub.last_event > 0                          # the daemon's `start`, at least
        col = Collector(sub)
        node = c.create("watched", 4096)["id"]
        col.wait(event_of("create", "watched"), what="the create event")
        i = col.wait(changed_with(node), what="a changed frame for the create")
        item = col.items[i]
        assert item["paths"][item["nodes"].index(node)] == "watched"
        # Opening and closing a handle logs no event, but holders change: a monitor redraws.
        h = c.open("watched", "r")
        opened = col.wait(changed_with(node), start=i + 1, timeout=2, what="changed at open")
        assert c.info("watched")["refcount"] == 1
        h.close()
        col.wait(changed_with(node), start=opened + 1, timeout=2, what="changed at close")
        assert not [it for it in col.items[i + 1:] if it["type"] == "event"
                    and it["event"]["path"] == "watched"]      # no event was logged for them


def test_mount_opens_are_changes(mounted_factory):
    d = mounted_factory()
    with d.client() as sc, d.client() as c:
        node = c.create("onmount", 4096, mode=0o644)["id"]
        col = Collector(sc.subscribe())
        with open(os.path.join(d.mnt, "onmount"), "rb") as f:
            opened = col.wait(changed_with(node), timeout=2, what="changed at a mount open")
            assert c.info("onmount")["refcount"] == 1
            f.read(10)
        col.wait(changed_with(node), start=opened + 1, timeout=2,
                 what="changed at the mount's release")


def test_subscribe_backlog_since(daemon):
    with daemon.client() as c:
        c.create("one", 4096)
        first = c.events(limit=1)[-1]["id"]
        c.create("two", 4096)
        c.remove("two")
    with daemon.client() as sc:
        sub = sc.subscribe(since=first, limit=1)          # the cap keeps the newest
        col = Collector(sub)
        col.wait(lambda it: True, what="the backlog")
        assert [it["event"]["kind"] for it in col.items] == ["remove"]
        assert col.items[0]["event"]["id"] == sub.last_event
    with daemon.client() as sc:
        sub = sc.subscribe(since=first)
        assert [e["kind"] for e in (next(sub)["event"], next(sub)["event"])] == \
            ["create", "remove"]
    with daemon.client() as sc:
        with pytest.raises(Exception, match="integer"):
            sc.subscribe(since="x")
        assert sc.info("one")["size"] == 4096             # a bad argument keeps the connection


def test_changed_frames_are_coalesced(daemon):
    with daemon.client() as sc, daemon.client() as c:
        node = c.create("busy", 4096)["id"]
        col = Collector(sc.subscribe())
        c.open("busy", "r").close()
        col.wait(changed_with(node), what="the first changed frame")
        col.settle()
        mark = len(col.items)
        start = time.monotonic()
        for _ in range(200):                   # 400 holder changes
            c.open("busy", "r").close()
        elapsed = time.monotonic() - start
        col.settle()
        frames = [it for it in col.items[mark:] if it["type"] == "changed"]
        # At most one frame per 50 ms (plus the trailing one); not one per change.
        assert 1 <= len(frames) <= elapsed / COALESCE + 3, (len(frames), elapsed)
        assert len(frames) < 200
        assert node in frames[-1]["nodes"]
        assert all(it["type"] == "changed" for it in col.items[mark:])   # no events logged


def test_slow_subscriber_is_cut_off(daemon):
    slow = daemon.client()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow_sub = slow.subscribe()                  # ... and never read
    with daemon.client() as reader, daemon.client() as c:
        col = Collector(reader.subscribe())
        sessions = c.status()["totals"]["sessions"]
        assert sessions == 3
        cut = False
        for i in range(4000):
            c.create(f"flood{i}", 4096)
            c.remove(f"flood{i}")
            if i % 100 == 99 and c.status()["totals"]["sessions"] < sessions:
                cut = True
                break
        assert cut, "the daemon never cut off a subscriber that does not read"
        assert "cutting off a subscriber too slow to read" in daemon.log()
        # The others are served: the reading subscriber got the last event, and calls work.
        col.wait(event_of("remove", f"flood{i}"), what="the last event, at the live reader")
        assert col.ended is None
        assert c.create("after", 4096)["size"] == 4096
        # The slow one finds the end of its stream after what had reached its socket.
        got = 0
        with pytest.raises(NotRunning):
            for _ in slow_sub:
                got += 1
        assert got < 2 * (i + 1)
    slow.close()


def test_close_from_another_thread_ends_subscribe(daemon):
    c = daemon.client()
    col = Collector(c.subscribe())
    time.sleep(0.3)                              # the thread is blocked reading
    assert col.ended is None and col.thread.is_alive()
    start = time.monotonic()
    c.close()
    col.thread.join(2)
    assert not col.thread.is_alive(), "subscribe() kept blocking after Client.close()"
    assert time.monotonic() - start < 2
    assert col.ended == "stop" or isinstance(col.ended, NotRunning), col.ended
    with daemon.client() as other:               # and the daemon let go of the session
        wait_for(lambda: other.status()["totals"]["sessions"] == 1, 5, what="session end")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_subscriber_does_not_see_private_allocations_of_others(daemon):
    with daemon.client() as root:
        root.mkdir("private", mode=0o700)
        root.create("private/secret", 4096)
        root.create("topsecret", 4096)           # 0600 at the top: its events are root's
    go_r, go_w = os.pipe()

    def as_nobody(sock):
        with Client(sock) as sc, Client(sock) as mine:
            col = Collector(sc.subscribe())
            mine.create("mine", 4096)
            col.wait(event_of("create", "mine"), what="my own create event")
            os.write(go_w, b"g")
            col.wait(lambda it: it["type"] == "changed" and "marker" in it["paths"],
                     timeout=20, what="the changed frame for root's marker")
            col.settle(0.3)
            return col.items

    def as_root():
        assert os.read(go_r, 1) == b"g"
        with daemon.client() as c:
            for name in ("private/secret", "topsecret"):
                c.open(name, "rw").close()
            c.set_durable("private/secret", True)
            c.create("private/other", 4096)
            c.remove("private/other")
            c.set_durable("topsecret", True)
            c.create("marker", 4096, mode=0o644)

    thread = threading.Thread(target=as_root)
    thread.start()
    try:
        items = run_as(as_nobody, daemon.socket)
    finally:
        os.close(go_w)
        thread.join(30)
        os.close(go_r)
    events = [it["event"] for it in items if it["type"] == "event"]
    assert ("create", "mine") in [(e["kind"], e["path"]) for e in events]
    leaked = [e for e in events if e["uid"] == 0 and e["node"] is not None]
    assert not leaked, leaked
    assert not [e for e in events if e["path"] and ("secret" in e["path"]
                                                   or "private" in e["path"])]
    paths = [p for it in items if it["type"] == "changed" for p in it["paths"]]
    assert "marker" in paths
    assert not [p for p in paths if p.startswith("private/")], paths


# ---- progress for long calls --------------------------------------------------------------------

def _pair(c) -> None:
    c.create("big", 64 * MiB)
    c.create("small", 32 * MiB)
    c.write("big", os.urandom(MiB) * 64)
    c.write("small", os.urandom(MiB) * 32)


def test_verify_progress(daemon):
    with daemon.client() as c:
        _pair(c)
        frames: list[dict] = []
        with_progress = c.verify(["big", "small"], progress=frames.append)
        plain = c.verify(["big", "small"])
        assert frames
        assert frames[0]["done_bytes"] == 0 and frames[0]["allocations_done"] == 0
        assert frames[0]["path"] == "big"
        done = [f["done_bytes"] for f in frames]
        assert done == sorted(done)
        assert all(f["total_bytes"] == 96 * MiB for f in frames)
        assert all(f["allocations"] == 2 for f in frames)
        assert frames[-1]["done_bytes"] <= 96 * MiB
        assert all(set(f) == {"path", "done_bytes", "total_bytes", "allocations_done",
                              "allocations"} for f in frames)
        assert with_progress["summary"] == plain["summary"]
        assert with_progress["summary"]["exit"] == 0 and \
            with_progress["summary"]["allocations"] == 2
        assert [r["path"] for r in with_progress["allocations"]] == ["big", "small"]
        assert with_progress["allocations"] == plain["allocations"]
        # recover takes it too
        frames.clear()
        recovered = c.recover("small", progress=frames.append)
        again = c.recover("small")
        assert recovered["allocation"] == again["allocation"]
        # Only the time of the last full pass (`verified`) may differ between the two.
        assert recovered["info"]["verified"] <= again["info"]["verified"]
        assert {k: v for k, v in recovered["info"].items() if k != "verified"} == \
            {k: v for k, v in again["info"].items() if k != "verified"}
        assert frames and frames[-1]["allocations"] == 1 and \
            frames[-1]["total_bytes"] == 32 * MiB
        # A callback that raises: the answer is still read, the connection stays in step.
        def boom(_):
            raise RuntimeError("boom")
        with pytest.raises(RuntimeError, match="boom"):
            c.verify(["small"], progress=boom)
        assert c.info("small")["size"] == 32 * MiB


def test_no_progress_frames_unless_asked(daemon):
    """Old clients: without `progress`, the first frame after the request is the answer."""
    with daemon.client() as c:
        c.create("small", 32 * MiB)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(daemon.socket)
    try:
        framing.send_frame(sock, {"id": 1, "op": "hello", "args": {"version": 1}})
        framing.recv_frame(sock, framing.MAX_RESPONSE_BYTES)
        framing.send_frame(sock, {"id": 2, "op": "verify", "args": {"all": True}})
        reply, _ = framing.recv_frame(sock, framing.MAX_RESPONSE_BYTES)
        assert reply["id"] == 2 and reply["ok"] is True, reply
        framing.send_frame(sock, {"id": 3, "op": "verify",
                                  "args": {"all": True, "progress": True}})
        reply, _ = framing.recv_frame(sock, framing.MAX_RESPONSE_BYTES)
        assert reply["id"] == 3 and "progress" in reply and "ok" not in reply, reply
    finally:
        sock.close()


def test_cli_verify_shows_no_progress_without_a_tty(daemon):
    with daemon.client() as c:
        _pair(c)
    proc = daemon.cli("verify", "--all", check=0)
    assert proc.stderr == b""
    assert b"verify: 2 allocation(s)" in proc.stdout


def test_cli_verify_progress_on_a_tty(daemon):
    with daemon.client() as c:
        _pair(c)
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(script_argv("gpumemctl") + ["--socket", daemon.socket, "verify",
                                                    "--all"],
                              stdout=subprocess.PIPE, stderr=slave, env=child_env(), timeout=60)
        os.close(slave)
        slave = -1
        meter = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:                      # EIO: the pty's other side is closed
                break
            if not chunk:
                break
            meter += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0
    assert b"verify: 2 allocation(s)" in proc.stdout and b"allocation" not in \
        proc.stdout.replace(b"allocation(s)", b"")
    text = meter.decode()
    assert text.startswith("\rverify: allocation 1/2 big: ") and "%" in text and "/s" in text
    assert text.endswith("\r\x1b[K")                # erased before the summary
