"""A socket peer's supplementary groups are the ones it had at connect() (issue 14).

Before, gpumemd read them from /proc/PID/status when it accepted the connection: by then the
process may have changed them, or exited and left its pid to another process, whose groups
it would lend. Now they come from the socket (SO_PEERGROUPS), as uid and gid already did
(SO_PEERCRED). The test makes the difference certain: the daemon is stopped (SIGSTOP) while
a process connects and exits, so that it accepts a connection whose pid no longer exists."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.open maps memory; nothing is imported after the uid drop
import os
import select
import signal
import socket
import threading

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError, framing
from gpumemctl.protocol.defaults import PROTOCOL_VERSION
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setgroups and setuid need root")
G = 4343                     # the group that may read "shared"


def _create_shared(sock: str) -> dict:
    with Client(sock, timeout=20) as c:
        return c.create("shared", 1 << 20, mode=0o640)


def _open_shared(sock: str) -> str:
    try:
        with Client(sock, timeout=20) as c:
            c.open("shared", "r").close()
        return "opened"
    except GpumemError as exc:
        return type(exc).__name__


def _connect_then_exit(sock_path: str, ready_w: int) -> str:
    """A child connects and exits; this process, of the same uid and groups, speaks on the
    socket it connected once the child is reaped (its pid gone from /proc)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            s.connect(sock_path)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.write(ready_w, b"x")          # the parent lets the daemon run again
    framing.send_frame(s, {"id": 1, "op": "hello", "args": {"version": PROTOCOL_VERSION}})
    framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    framing.send_frame(s, {"id": 2, "op": "open", "args": {"path": "shared", "mode": "r"}})
    reply, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    framing.close_fds(fds)
    return "opened" if reply.get("ok") else reply["error"]["name"]


def _resume_when_ready(pid: int, ready_r: int) -> threading.Thread:
    def resume():
        try:
            select.select([ready_r], [], [], 20)
        finally:
            os.kill(pid, signal.SIGCONT)
    thread = threading.Thread(target=resume, daemon=True)
    thread.start()
    return thread


def test_group_members_may_read_and_others_may_not(daemon):
    made = run_as(_create_shared, daemon.socket, uid=0, gid=G)
    assert made["gid"] == G and made["mode"] == "0640"
    assert run_as(_open_shared, daemon.socket, groups=[G]) == "opened"
    assert run_as(_open_shared, daemon.socket) == "PermissionDenied"


def test_the_groups_are_those_at_connect_not_of_a_pid_read_later(daemon):
    run_as(_create_shared, daemon.socket, uid=0, gid=G)
    ready_r, ready_w = os.pipe()
    os.kill(daemon.proc.pid, signal.SIGSTOP)        # it accepts only after the child is gone
    resumer = _resume_when_ready(daemon.proc.pid, ready_r)
    try:
        result = run_as(_connect_then_exit, daemon.socket, ready_w, groups=[G])
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
        resumer.join(5)
        os.close(ready_r)
        os.close(ready_w)
    assert result == "opened"


def _connect_with_groups(path: str, groups: list[int]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups(groups)
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(path)
        finally:
            os._exit(0)
    return pid


@pytest.mark.parametrize("count", [0, 3, 300])     # 300: past what one getsockopt() buffer holds
def test_peer_groups_reads_the_peers_groups_from_the_socket(tmp_path, count):
    from daemon.core.permissions import peer_groups
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    groups = list(range(70_000, 70_000 + count))
    pid = _connect_with_groups(path, groups)
    conn, _ = listener.accept()
    os.waitpid(pid, 0)                               # gone: /proc has nothing to tell
    with conn, listener:
        assert peer_groups(conn, pid) == frozenset(groups)
