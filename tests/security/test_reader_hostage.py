"""A reader holding a read lock forever blocked the owner's writes (issue 14). Now the owner
(or the administrator) may `revoke` the read handles and read-only attachments of every other
session: the writes go ahead, the reader's mapping stays valid (and sees them), its later close
answers quietly, and nobody else may revoke. Run with the owner and the reader as two uids
other than root."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.open maps the memory; nothing is imported after the uid drop
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import HeldAs, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
OWNER, READER, STRANGER = 65534, 4243, 4244
BUSY, PERMISSION = 9, 6


def attempt(fn, *args, **kw) -> dict:
    try:
        return {"value": fn(*args, **kw)}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}


def _make(sock: str) -> None:
    c = Client(sock)
    c.create("model", 1 << 20, mode=0o644)
    c.close()


def _hold(sock: str):
    c = Client(sock)
    handle = c.open("model", "r")
    return {"held": True}, [c, handle]


def _write(sock: str, what: bytes) -> int:
    c = Client(sock)
    with c.open("model", "rw") as h:
        h.write(what, 0)
    c.close()
    return len(what)


def _owner(sock: str) -> dict:
    c = Client(sock)
    res = {"blocked": attempt(c.open, "model", "rw")}
    res["revoked"] = c.revoke("model")
    c.close()
    res["write"] = attempt(_write, sock, b"new weights")
    return res


def _stranger(sock: str) -> dict:
    c = Client(sock)
    res = attempt(c.revoke, "model")
    c.close()
    return res


def test_the_owner_can_take_a_read_lock_from_a_reader_that_never_lets_go(daemon):
    run_as(_make, daemon.socket, uid=OWNER, gid=OWNER)
    with HeldAs(_hold, daemon.socket, uid=READER, gid=READER):
        assert run_as(_stranger, daemon.socket, uid=STRANGER, gid=STRANGER)["code"] == \
            PERMISSION
        res = run_as(_owner, daemon.socket, uid=OWNER, gid=OWNER)
        assert res["blocked"]["code"] == BUSY and "locked" in res["blocked"]["message"]
        assert [(h["kind"], h["uid"]) for h in res["revoked"]] == [("read", READER)]
        assert res["write"] == {"value": 11}
        assert daemon.client().read_copy("model", 0, 11) == b"new weights"
        kinds = [e["kind"] for e in daemon.client().events(path="model")]
        assert "revoke" in kinds
    # the reader's session ended with its revoked handle: nothing is left, nothing failed
    assert daemon.client().info("model")["holders"] == []


def test_a_revoked_readers_close_answers_quietly(daemon):
    run_as(_make, daemon.socket, uid=OWNER, gid=OWNER)
    c = daemon.client()                        # root reads ...
    handle = c.open("model", "r")
    before = bytes(handle.read(0, 4)) if hasattr(handle, "read") else None
    revoked = run_as(_owner, daemon.socket, uid=OWNER, gid=OWNER)["revoked"]
    assert [h["uid"] for h in revoked] == [0]  # ... and the owner takes it back
    handle.close()                             # no error: the handle was already let go
    assert c.info("model")["holders"] == [] and before is not None
    c.close()
