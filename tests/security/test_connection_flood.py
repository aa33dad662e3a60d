"""A local user flooding the daemon's socket with connections (issue 14): the daemon stays
up and root is served. Before: two processes opening 10,000 connections each made accept()
fail with EMFILE, the error left the accept loop and the daemon stopped, unmounting and
freeing every user's transient memory.

What holds now (docs/security.md): a per-uid cap (max_connections_per_uid) and a total cap
kept below the open-file limit (max_connections), with room kept for root; a refused
connection hears `busy` (exit 9) and why; accept() failing for want of descriptors waits and
goes on; a connection that does not say hello within 5 s is let go."""
from __future__ import annotations

import os
import resource
import socket
import time

from gpumemctl.protocol import PROTOCOL_VERSION, framing
from tests.users import HeldAs

FLOOD = 6000
PER_UID = 64


def _raise_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FLOOD + 512, FLOOD + 512))


def flood(path: str, count: int):
    """Open `count` connections, each saying hello; report how each was answered, keep
    the ones that stay open."""
    socks, unanswered = [], 0
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            framing.send_frame(s, {"id": 1, "op": "hello",
                                   "args": {"version": PROTOCOL_VERSION, "client": "flood"}})
        except OSError:
            s.close()
            unanswered += 1
            continue
        socks.append(s)
    admitted, refused, why = [], 0, ""
    deadline = time.monotonic() + 10          # for all answers together
    for s in socks:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            reply, _fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
        except (OSError, EOFError):
            unanswered += 1
            continue
        if reply.get("ok"):
            admitted.append(s)
        else:
            refused += 1
            why = reply["error"]["message"]
            s.close()
    return ({"admitted": len(admitted), "refused": refused, "unanswered": unanswered,
             "why": why}, admitted)


def config(daemon_factory, tmp_path, **keys):
    path = tmp_path / "gpumemd.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in keys.items()))
    return daemon_factory(extra_args=["--config", str(path)])


def timed_ls(daemon) -> float:
    start = time.monotonic()
    with daemon.client() as root:          # connecting is part of what root waits for
        root.ls("")
    return time.monotonic() - start


def test_one_user_holding_thousands_of_connections_locks_nobody_out(daemon_factory, tmp_path):
    d = config(daemon_factory, tmp_path, max_connections_per_uid=PER_UID)
    d.cli("create", "kept", "--size", "1M", check=True)
    with HeldAs(flood, d.socket, FLOOD, before=_raise_fd_limit, timeout=300) as attacker:
        report = attacker.report
        assert report["admitted"] == PER_UID, report
        assert report["refused"] + report["unanswered"] == FLOOD - PER_UID, report
        assert f"uid 65534 has {PER_UID} connections open" in report["why"], report
        assert "max_connections_per_uid" in report["why"]
        waited = timed_ls(d)
        assert waited < 1.0, f"root's ls took {waited:.2f} s under the flood"
        assert d.cli("ls").returncode == 0
    assert d.cli_json("status")["daemon"]["pid"] == d.proc.pid     # the same daemon
    assert [e["path"] for e in d.cli_json("ls")] == ["kept"]
    assert d.cli("check").returncode == 0


def test_accept_out_of_descriptors_waits_and_goes_on(daemon_factory, tmp_path):
    """The daemon's open-file limit lowered under it: accept() meets EMFILE. It logs,
    backs off and serves again once descriptors are free."""
    d = config(daemon_factory, tmp_path, max_connections_per_uid=1000)
    d.allow_errors = True                                  # the EMFILE is logged at ERROR
    in_use = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
    soft, hard = resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (in_use + 40, hard))
    try:
        with HeldAs(flood, d.socket, 300, before=_raise_fd_limit, timeout=300) as attacker:
            assert 0 < attacker.report["admitted"] < 300, attacker.report
        # The flood is gone: its descriptors are free again.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and d.cli("ls").returncode != 0:
            time.sleep(0.2)
        assert d.cli("ls").returncode == 0
        assert "accept() on" in d.log() and "descriptors are free" in d.log()
    finally:
        resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert d.proc.poll() is None
    assert d.cli("check").returncode == 0


def test_a_connection_that_never_says_hello_is_let_go(daemon):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(daemon.socket)
    s.settimeout(15)
    start = time.monotonic()
    assert s.recv(1) == b""                # closed by the daemon, not by us
    assert 4 < time.monotonic() - start < 12
    s.close()


def _hello_and_go(path: str, count: int) -> int:
    """Say hello and hang up before the answer comes, `count` times (a client killed in
    its handshake): the daemon opened a session for each and, when the answer failed to
    send, never ended it."""
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        framing.send_frame(s, {"id": 1, "op": "hello",
                               "args": {"version": PROTOCOL_VERSION, "client": "gone"}})
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()                     # SO_LINGER 0: a reset, the answer cannot be sent
    return count


def test_a_client_gone_before_its_hello_is_answered_leaves_no_session(daemon):
    from tests.users import run_as
    run_as(_hello_and_go, daemon.socket, 300)
    deadline = time.monotonic() + 5
    while (sessions := daemon.client().status()["totals"]["sessions"]) > 1 and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert sessions == 1                   # only the session asking
