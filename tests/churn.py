"""Connection churn (issue 24, item 10): one unprivileged uid holds all the connections its
cap allows and then connects and hangs up in a tight loop, from several processes and
threads, while root's `Client().ls("")`, a new connection each, is timed.
tests/security/test_connection_churn.py asserts that root is served throughout (with a
generous bound); bench/churn.py prints root's latencies alone and during the churn.

Workers are forked children that drop to their uid first (tests/soak.py's _fork_as) and
report through a pipe as JSON. Standard library and the client library only.
"""
from __future__ import annotations

import socket
import threading
import time

from gpumemctl import Client
from gpumemctl.protocol import PROTOCOL_VERSION, GpumemError, framing
from tests.soak import _collect, _fork_as

CHURNER = 65534
HELLO = {"id": 1, "op": "hello", "args": {"version": PROTOCOL_VERSION, "client": "churn"}}


def _hold(sock: str, count: int, deadline: float) -> dict:
    """Open `count` connections that say hello and stay, until `deadline`: the uid is then
    at its max_connections_per_uid and every further connection of it is refused."""
    held, refused = [], 0
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(sock)
            framing.send_frame(s, HELLO)
            reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
        except (OSError, EOFError):
            s.close()
            refused += 1
            continue
        if reply.get("ok"):
            held.append(s)
        else:
            refused += 1
            s.close()
    time.sleep(max(0.0, deadline - time.monotonic()))
    for s in held:
        s.close()
    return {"held": len(held), "refused": refused}


def _churn_thread(sock: str, deadline: float, hello: bool, counts: list[int]) -> None:
    connects = failures = 0
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
            if hello:
                s.send(framing.encode(HELLO))
            connects += 1
        except OSError:
            failures += 1
        finally:
            s.close()
    counts.extend((connects, failures))


def _churn(sock: str, threads: int, deadline: float, hello: bool) -> dict:
    """Connect and hang up as fast as `threads` threads can until `deadline`."""
    results: list[list[int]] = [[] for _ in range(threads)]
    workers = [threading.Thread(target=_churn_thread, args=(sock, deadline, hello, out))
               for out in results]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"connects": sum(r[0] for r in results), "failures": sum(r[1] for r in results)}


def root_ls(sock: str, deadline: float, interval: float = 0.01) -> dict:
    """Root's `Client(sock).ls("")` with a new connection each, one every `interval`;
    each timed from connect to answer."""
    times, errors = [], []
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            with Client(sock, timeout=60) as c:
                c.ls("")
        except GpumemError as exc:
            errors.append(str(exc))
        times.append(time.perf_counter() - start)
        time.sleep(interval)
    return {"times": times, "errors": errors[:20], "failed": len(errors)}


def churn(sock: str, seconds: float, per_uid: int, processes: int = 4, threads: int = 8,
          hello: bool = False, settle: float = 1.0) -> dict:
    """One uid at its connection cap, churning from `processes` x `threads` workers for
    `seconds`, root's ls timed meanwhile (after `settle` seconds, once the churn runs)."""
    deadline = time.monotonic() + settle + seconds
    children = [("holder", *_fork_as(CHURNER, _hold, sock, per_uid, deadline))] \
        if per_uid else []
    time.sleep(settle / 2)                        # the holder first: the cap is reached
    for i in range(processes):
        children.append((f"churn{i}",
                         *_fork_as(CHURNER, _churn, sock, threads, deadline, hello)))
    time.sleep(settle / 2)
    root = root_ls(sock, deadline)
    reports = {who: _collect(pid, r) for who, pid, r in children}
    connects = sum(r.get("connects", 0) for r in reports.values())
    return {"root": root, "workers": reports, "connects": connects,
            "connects_per_s": connects / (seconds + settle / 2)}
