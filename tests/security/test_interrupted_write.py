"""A writer whose close never came (issue 14, lower): when gpumemd was killed during a long
durable `gpumemctl write` whose data had fully landed, the restarted daemon recorded neither
`modified` nor a `write` event for it. Now the start-up notes every writer the registry
still listed: the modification time moves, and a `write` event in the writer's name says
that the range written is unknown (`range_unknown`)."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.open maps the memory; nothing is imported after the uid drop
import os
import time

import pytest

from gpumemctl import Client
from tests.users import HeldAs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
WRITER = 65534


def _write_and_hang(sock: str):
    c = Client(sock)
    c.create("weights", 1 << 20, durable=True)
    h = c.open("weights", "rw")
    h.write(b"landed before the crash", 0)
    return {"modified": c.info("weights")["modified"]}, [c, h]


def test_a_writer_open_at_a_crash_leaves_a_write_event_and_a_new_mtime(daemon):
    with HeldAs(_write_and_hang, daemon.socket, uid=WRITER, gid=WRITER) as held:
        before = held.report["modified"]
        time.sleep(1.1)              # the write is in, no close comes; "modified" moves on
        daemon.restart(hard=True)                       # kill -9, start again
    c = daemon.client()
    info = c.info("weights")
    assert info["state"] == "ready" and info["durable"] is True
    assert info["modified"] > before           # ISO 8601 times of one format sort as times
    assert c.read_copy("weights", 0, 23) == b"landed before the crash"
    writes = [e for e in c.events(path="weights") if e["kind"] == "write"]
    assert writes, c.events(path="weights")
    assert writes[-1]["uid"] == WRITER
    assert writes[-1]["detail"] == {"range_unknown": True}
    assert c.check()["clean"] is True
