"""One answer's size, and answers nobody reads (issue 14): an `events` request over a large
backlog took gpumemd from 59 MB to 1 GB of memory, and four clients that never read their
answers to 2.5 GB. Now an `events` answer carries the newest events that fit in
EVENTS_ANSWER_BYTES (`complete: false` says older ones were left out; `since` pages on), and
the frames one user leaves unread are bounded (SEND_BUDGET_PER_UID): past that, the
connection is closed. Run as uid 65534 against a root daemon."""
from __future__ import annotations

import os
import socket
import time

import pytest

from daemon.server.streams import EVENTS_ANSWER_BYTES
from daemon.server.transport import SEND_BUDGET_PER_UID
from gpumemctl import Client
from gpumemctl.protocol import PROTOCOL_VERSION, framing
from tests.harness import rss_bytes
from tests.users import HeldAs, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
DEEP = "/".join(["d" * 250] * 15)          # a 3.7 KB directory path: every event carries it
ROUNDS = 800                               # x2 events of ~3.8 KB: past EVENTS_ANSWER_BYTES


def _make_backlog(sock: str) -> int:
    c = Client(sock, timeout=60)
    c.mkdir(DEEP, parents=True)
    for i in range(ROUNDS):
        c.create(f"{DEEP}/f{i}", 4096)
        c.remove(f"{DEEP}/f{i}")
    last = c.events(limit=1)[-1]["id"]
    c.close()
    return last


def _read_events(sock: str) -> dict:
    c = Client(sock, timeout=60)
    answer = c.call("events", since=0, limit=10_000)
    size = len(framing.encode({"result": answer}))
    paged = c.call("events", since=answer["events"][-1]["id"] - 10, limit=10_000)
    c.close()
    return {"n": len(answer["events"]), "complete": answer["complete"], "size": size,
            "ids": [e["id"] for e in answer["events"]],
            "paged": [e["id"] for e in paged["events"]], "paged_complete": paged["complete"]}


def test_an_events_answer_is_bounded_and_keeps_the_newest(daemon):
    last = run_as(_make_backlog, daemon.socket, timeout=300)
    got = run_as(_read_events, daemon.socket)
    assert got["complete"] is False
    assert got["size"] < EVENTS_ANSWER_BYTES + (1 << 20)      # JSON of what fit, and no more
    assert 500 < got["n"] < 2 * ROUNDS                         # many, but not every one
    assert got["ids"][-1] == last                              # the newest are kept
    assert got["ids"] == sorted(got["ids"])                    # oldest first, as always
    assert got["paged"] == list(range(last - 9, last + 1))     # `since` pages on
    assert got["paged_complete"] is True
    proc = daemon.cli("events", "--limit", "10000", check=True)      # root's CLI says so
    assert b"warning: older events were left out" in proc.stderr
    assert proc.stdout.count(b"\n") < 2 * ROUNDS


def _never_read(sock: str, n: int):
    """Open n connections, ask each for the whole event log, and read nothing back."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        framing.send_frame(s, {"id": 1, "op": "hello",
                               "args": {"version": PROTOCOL_VERSION}})
        framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
        framing.send_frame(s, {"id": 2, "op": "events", "args": {"limit": 10_000}})
        held.append(s)
    return {"opened": n}, held


def test_answers_nobody_reads_are_bounded_per_user(daemon):
    run_as(_make_backlog, daemon.socket, timeout=300)
    pid = daemon.proc.pid
    before = rss_bytes(pid)
    n = 100                    # ~4.5 MB answers each: 450 MB if the daemon kept them all
    with HeldAs(_never_read, daemon.socket, n):
        time.sleep(3)
        during = rss_bytes(pid)
        t0 = time.monotonic()
        entries = daemon.client().ls("")      # root is answered meanwhile
        took = time.monotonic() - t0
    assert took < 1.0 and entries is not None
    # Unbounded (the old code) this grew by 920 MB; now by about 70 MB.
    assert during - before < SEND_BUDGET_PER_UID + (150 << 20), (before, during)
    assert "do not read" in daemon.log()
