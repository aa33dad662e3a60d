"""The daemon's send limits (daemon/server/transport.py, docs/protocol.md "Limits") on a
real socket pair: an answer past MAX_ANSWER_BYTES becomes a usage error that says so; a user
whose connections leave more than SEND_BUDGET_PER_UID bytes unread has the next one closed;
a peer that takes nothing for SEND_STALL_SECONDS is let go. Root has no send budget."""
from __future__ import annotations

import os
import socket

import pytest
import trio

from daemon.server import transport
from daemon.server.transport import Connection, ConnectionLimits, SendRefused
from gpumemctl.protocol import framing


def pair(limits: ConnectionLimits | None = None
         ) -> tuple[Connection, socket.socket, ConnectionLimits]:
    """A daemon-side Connection (inside trio.run) and a blocking peer socket."""
    ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    limits = limits or ConnectionLimits(100, 10)
    peer = socket.socket(fileno=os.dup(theirs.fileno()))
    theirs.close()
    return Connection(ours, limits), peer, limits


def receive(peer: socket.socket):
    return trio.to_thread.run_sync(framing.recv_frame, peer, framing.MAX_RESPONSE_BYTES)


def test_an_answer_past_the_limit_is_a_usage_error_naming_the_limit(monkeypatch):
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1 << 16)

    async def main():
        conn, peer, limits = pair()
        await conn.answer(7, {"entries": ["x" * 1000] * 100})     # ~100 KB
        reply, _ = await receive(peer)
        assert reply["id"] == 7 and reply["ok"] is False
        assert reply["error"]["code"] == 2
        assert "65536" in reply["error"]["message"]
        assert "Limits" in reply["error"]["message"]
        assert reply["error"]["details"]["limit"] == 1 << 16
        await conn.answer(8, {"entries": ["x" * 1000] * 10})       # under it: as before
        reply, _ = await receive(peer)
        assert reply["ok"] is True and len(reply["result"]["entries"]) == 10
        assert limits.unsent == {}
        peer.close()
        conn.close()
    trio.run(main)


def test_a_user_past_the_send_budget_has_the_connection_closed(monkeypatch):
    """Two connections of one (unprivileged) user, neither read: the first frame fills the
    socket and waits, counted; the second would pass the budget and is refused."""
    monkeypatch.setattr(transport, "SEND_BUDGET_PER_UID", 4 << 20)
    monkeypatch.setattr(ConnectionLimits, "privileged", staticmethod(lambda uid: False))
    big = {"blob": "y" * (3 << 20)}

    async def main():
        first, peer1, limits = pair()
        second, peer2, _ = pair(limits)
        refused = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.push, big)        # blocks: nobody reads peer1
            await trio.sleep(0.2)
            unsent = dict(limits.unsent)
            try:
                await second.push(big)
            except SendRefused as exc:
                refused = str(exc)
            nursery.cancel_scope.cancel()
        assert unsent[os.geteuid()] > 3 << 20
        assert "too many bytes unread" in refused
        assert await trio.to_thread.run_sync(peer2.recv, 1) == b""   # closed
        assert limits.unsent == {}       # what was counted is counted out again
        for s in (peer1, peer2):
            s.close()
        first.close()
    trio.run(main)


def test_root_has_no_send_budget(monkeypatch):
    monkeypatch.setattr(transport, "SEND_BUDGET_PER_UID", 1 << 20)
    limits = ConnectionLimits(100, 10)
    assert limits.reserve_send(0, 1 << 20) and limits.reserve_send(0, 1 << 20)
    assert limits.unsent == {0: 2 << 20}
    assert limits.reserve_send(65534, 1 << 20)            # the first frame always goes
    assert not limits.reserve_send(65534, 1)              # then the budget holds


def test_a_peer_that_takes_nothing_is_let_go(monkeypatch):
    monkeypatch.setattr(transport, "SEND_STALL_SECONDS", 0.5)

    async def main():
        conn, peer, limits = pair()
        with pytest.raises(SendRefused, match="took nothing"):
            await conn.push({"blob": "z" * (8 << 20)})
        assert limits.unsent == {}

        def drain() -> int:
            got = 0
            while chunk := peer.recv(1 << 20):    # what was sent, then end of file
                got += len(chunk)
            return got
        got = await trio.to_thread.run_sync(drain)
        assert 0 < got < 8 << 20
        peer.close()
    trio.run(main)
