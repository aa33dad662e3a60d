"""Raw-socket misbehaviour: peers that do not speak the protocol, or speak it badly.

Every case talks to a real gpumemd over its Unix socket with hand-made bytes, then checks that
the daemon is unharmed: the process is alive and a fresh Client can create an allocation,
write it, read it back and remove it. Where fds are passed, the daemon's own fd table
(/proc/PID/fd) must not grow: whatever it received it must close.

What the daemon promises (daemon/server/, gpumemctl/protocol/framing.py): a framing error
(bad magic, oversized frame, too many fds, truncated frame, payload that is not a JSON object)
is answered once with an error frame {id: null, ok: false, error: {code: 2, ...}} and the
connection is closed; a bad *request* inside a good frame (unknown op, wrong argument types)
is answered with code 2 and the connection stays usable.
"""
from __future__ import annotations

import errno
import json
import os
import random
import socket
import threading
import time

import pytest

from gpumemctl import Client
from gpumemctl.protocol import PROTOCOL_VERSION, framing
from tests.harness import rss_bytes, wait_for

MiB = 1 << 20
HELLO = {"id": 1, "op": "hello", "args": {"version": PROTOCOL_VERSION}}
USAGE = 2


# ---- helpers ---------------------------------------------------------------------------------

def raw(daemon, timeout: float = 10.0) -> socket.socket:
    """A connected socket. A connect with a timeout is non-blocking underneath, and a Unix
    socket answers EAGAIN (not EINPROGRESS) while the listen backlog is full: retry then."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(daemon.socket)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def frame(payload: bytes | dict, *, nfds: int = 0, length: int | None = None,
          magic: bytes = framing.MAGIC) -> bytes:
    if isinstance(payload, dict):
        payload = json.dumps(payload).encode()
    n = len(payload) if length is None else length
    return framing.HEADER.pack(magic, n, nfds, 0) + payload


def hello(s: socket.socket) -> dict:
    s.sendall(frame(HELLO))
    reply, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    framing.close_fds(fds)
    assert reply["ok"] is True and reply["id"] == 1, reply
    return reply["result"]


def request(s: socket.socket, rid, op, **args) -> dict:
    s.sendall(frame({"id": rid, "op": op, "args": args}))
    reply, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    framing.close_fds(fds)
    return reply


def read_until_close(s: socket.socket, limit: int = 10) -> list[dict]:
    """Every frame the daemon sends until it closes the connection. A reset counts as a close:
    on a Unix stream socket the peer sees ECONNRESET instead of EOF when the daemon closes
    with unread bytes of ours still queued (after garbage, say). A timeout means the daemon
    kept the connection open, which these cases treat as a failure."""
    frames: list[dict] = []
    while len(frames) < limit:
        try:
            msg, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
        except (EOFError, ConnectionResetError):
            return frames
        framing.close_fds(fds)
        frames.append(msg)
    raise AssertionError(f"daemon kept talking: {frames!r}")


def only_error(frames: list[dict], code: int = USAGE) -> dict:
    assert len(frames) == 1, frames
    msg = frames[0]
    assert msg["ok"] is False, msg
    err = msg["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"], err
    return err


def daemon_pid(daemon) -> int:
    return daemon.proc.pid


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_targets(pid: int) -> list[str]:
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except OSError:
            pass
    return out


_canary = iter(range(1_000_000))


def assert_serving(daemon) -> None:
    """The daemon process is alive and a fresh client can create, write, read back, remove."""
    assert daemon.proc.poll() is None, "gpumemd died:\n" + daemon.log()[-4000:]
    name = f"canary-{next(_canary)}"
    data = os.urandom(4096)
    with daemon.client(timeout=10) as c:
        assert c.hello["pid"] == daemon_pid(daemon)
        info = c.create(name, MiB)
        assert info["path"] == name and info["size"] == MiB
        c.write(name, data)
        assert c.read(name, 0, len(data)) == data
        assert c.info(name)["state"] == "ready"
        assert c.remove(name) == [name]
    assert daemon.proc.poll() is None


def settled_fd_count(daemon) -> int:
    """The daemon's fd count once connections from earlier steps are gone."""
    pid = daemon_pid(daemon)
    assert_serving(daemon)      # warms up lazily opened files (sqlite WAL/shm, ...)
    last = [None]

    def stable():
        n = fd_count(pid)
        same = n == last[0]
        last[0] = n
        return same
    wait_for(stable, timeout=5, interval=0.1, what="a stable fd count")
    return last[0]


def wait_fds_back(daemon, baseline: int) -> None:
    pid = daemon_pid(daemon)
    try:
        wait_for(lambda: fd_count(pid) <= baseline, timeout=5, interval=0.05,
                 what="the daemon's fd count to return to its baseline")
    except AssertionError:
        raise AssertionError(f"gpumemd holds {fd_count(pid)} fds, baseline {baseline}: "
                             f"{sorted(fd_targets(pid))}") from None


# ---- garbage and truncation ------------------------------------------------------------------

def test_http_request_instead_of_a_frame(daemon):
    s = raw(daemon)
    s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    err = only_error(read_until_close(s))
    assert "magic" in err["message"]
    s.close()
    assert_serving(daemon)


@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
def test_random_garbage(daemon, after_hello):
    s = raw(daemon)
    if after_hello:
        hello(s)
    rng = random.Random(1234)
    junk = b"XXXX" + bytes(rng.randrange(256) for _ in range(4092))   # never b"GMP1"
    s.sendall(junk)
    err = only_error(read_until_close(s))
    assert "magic" in err["message"]
    s.close()
    assert_serving(daemon)


def test_short_garbage_then_eof(daemon):
    """Fewer bytes than a header, then EOF: nothing to answer, just a close."""
    s = raw(daemon)
    s.sendall(b"xyz")
    s.shutdown(socket.SHUT_WR)
    frames = read_until_close(s)
    assert all(f["ok"] is False and f["error"]["code"] == USAGE for f in frames), frames
    s.close()
    assert_serving(daemon)


def test_connect_and_close_without_a_byte(daemon):
    for _ in range(20):
        raw(daemon).close()
    assert_serving(daemon)


@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize("how", ["shutdown", "close"])
def test_truncated_frame(daemon, after_hello, how):
    """A header promising 1000 payload bytes, then 10 bytes and the end of the stream."""
    s = raw(daemon)
    if after_hello:
        hello(s)
    s.sendall(frame(b'{"id":2,"o', length=1000))
    if how == "shutdown":
        s.shutdown(socket.SHUT_WR)
        frames = read_until_close(s)
        # the peer is gone mid-frame: the daemon just closes (an error frame would be allowed)
        assert all(f["ok"] is False for f in frames), frames
    s.close()
    assert_serving(daemon)


def test_truncated_header(daemon):
    s = raw(daemon)
    hello(s)
    s.sendall(framing.MAGIC + b"\x00")
    s.shutdown(socket.SHUT_WR)
    assert all(f["ok"] is False for f in read_until_close(s))
    s.close()
    assert_serving(daemon)


def test_slow_loris_does_not_block_others(daemon):
    """Peers that stall mid-header or mid-payload hold only their own connection."""
    stalled = []
    for _ in range(10):
        a = raw(daemon)
        a.sendall(framing.MAGIC[:3])                          # stalls inside the header
        b = raw(daemon)
        hello(b)
        b.sendall(frame(b'{"id":2,"op":"ls"', length=500))     # stalls inside the payload
        stalled += [a, b]
    t0 = time.monotonic()
    assert_serving(daemon)
    assert time.monotonic() - t0 < 5
    for s in stalled:
        s.close()
    assert_serving(daemon)


# ---- size limits -----------------------------------------------------------------------------

@pytest.mark.parametrize("length", [2**31, 2**32 - 1, framing.MAX_REQUEST_BYTES + 1])
@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
def test_oversized_frame_is_refused_before_reading(daemon, length, after_hello):
    pid = daemon_pid(daemon)
    assert_serving(daemon)
    rss_before = rss_bytes(pid)
    s = raw(daemon)
    if after_hello:
        hello(s)
    s.sendall(framing.HEADER.pack(framing.MAGIC, length, 0, 0) + b'{"id":2,')
    err = only_error(read_until_close(s))
    assert "limit" in err["message"]
    assert str(framing.MAX_REQUEST_BYTES) in err["message"] and str(length) in err["message"]
    s.close()
    assert_serving(daemon)
    # it never reserved anything like `length` bytes for the payload
    assert rss_bytes(pid) - rss_before < 64 * MiB


def test_largest_allowed_request_is_read_and_answered(daemon):
    """A frame of exactly the limit is read in full (and then rejected as a request)."""
    s = raw(daemon)
    hello(s)
    pad = framing.MAX_REQUEST_BYTES - len(b'{"id":2,"op":"ls","args":{},"pad":""}')
    payload = b'{"id":2,"op":"ls","args":{},"pad":"' + b"a" * pad + b'"}'
    assert len(payload) == framing.MAX_REQUEST_BYTES
    s.sendall(frame(payload))
    reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    assert reply["ok"] is True and reply["id"] == 2, reply
    assert request(s, 3, "ls")["ok"] is True
    s.close()
    assert_serving(daemon)


# ---- file descriptors ------------------------------------------------------------------------

@pytest.mark.parametrize("declared", [framing.MAX_FDS_PER_FRAME + 1, 0xFFFF])
def test_header_declaring_too_many_fds(daemon, declared):
    s = raw(daemon)
    hello(s)
    s.sendall(frame({"id": 2, "op": "ls", "args": {}}, nfds=declared))
    err = only_error(read_until_close(s))
    assert f"at most {framing.MAX_FDS_PER_FRAME}" in err["message"]
    s.close()
    assert_serving(daemon)


def _bait_fds(tmp_path, n: int) -> tuple[str, list[int]]:
    """n fds on one recognisable file, so the daemon's fd table can be searched for it."""
    bait = str(tmp_path / "fd-bait")
    with open(bait, "wb") as f:
        f.write(b"bait")
    return bait, [os.open(bait, os.O_RDONLY | os.O_CLOEXEC) for _ in range(n)]


def _send_with_fds(s: socket.socket, data: bytes, fds: list[int]) -> None:
    sent = s.sendmsg([data], framing.ancillary(fds))
    if sent < len(data):
        s.sendall(data[sent:])


def test_hundreds_of_fds_in_one_message(daemon, tmp_path):
    """300 fds in one sendmsg. Linux caps one SCM_RIGHTS message at SCM_MAX_FD (253), so the
    sender's kernel may refuse 300 (EINVAL / ETOOMANYREFS); then the largest count the kernel
    takes is sent instead. The daemon gets at most its buffer's worth (MSG_CTRUNC), must answer
    with a usage error, hang up, and close every fd it received."""
    pid = daemon_pid(daemon)
    baseline = settled_fd_count(daemon)
    bait, fds = _bait_fds(tmp_path, 300)
    try:
        s = raw(daemon)
        hello(s)
        sent_count = None
        for count in (300, 253, 200, 128, 64):
            data = frame({"id": 2, "op": "ls", "args": {}}, nfds=min(count, 0xFFFF))
            try:
                _send_with_fds(s, data, fds[:count])
            except OSError as exc:
                assert exc.errno in (errno.EINVAL, errno.ETOOMANYREFS), exc
                continue
            sent_count = count
            break
        assert sent_count is not None and sent_count > framing.MAX_FDS_PER_FRAME
        err = only_error(read_until_close(s))
        assert "fds" in err["message"] and str(framing.MAX_FDS_PER_FRAME) in err["message"]
        s.close()
    finally:
        framing.close_fds(fds)
    assert_serving(daemon)
    wait_fds_back(daemon, baseline)
    assert bait not in fd_targets(pid)


@pytest.mark.parametrize("phase", ["hello", "request"])
def test_fds_within_the_limit_are_closed(daemon, tmp_path, phase):
    """Requests carry no fds. 16 (the per-frame maximum) on hello are dropped; on a request
    they are refused with a usage error and the connection stays usable. Either way the
    daemon closes them."""
    pid = daemon_pid(daemon)
    baseline = settled_fd_count(daemon)
    bait, fds = _bait_fds(tmp_path, framing.MAX_FDS_PER_FRAME)
    try:
        s = raw(daemon)
        if phase == "hello":
            _send_with_fds(s, frame(HELLO, nfds=len(fds)), fds)
            reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
            assert reply["ok"] is True, reply
        else:
            hello(s)
            _send_with_fds(s, frame({"id": 2, "op": "ls", "args": {}}, nfds=len(fds)), fds)
            reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
            assert reply["ok"] is False and reply["id"] == 2
            assert reply["error"]["code"] == USAGE and "descriptor" in reply["error"]["message"]
        framing.close_fds(fds)
        fds = []
        # still usable, and nothing of the bait stays open in the daemon meanwhile
        assert request(s, 3, "ls")["ok"] is True
        assert bait not in fd_targets(pid)
        s.close()
    finally:
        framing.close_fds(fds)
    assert_serving(daemon)
    wait_fds_back(daemon, baseline)


@pytest.mark.parametrize("declared,sent", [(2, 1), (0, 3), (1, 0)])
def test_fd_count_mismatch(daemon, tmp_path, declared, sent):
    pid = daemon_pid(daemon)
    baseline = settled_fd_count(daemon)
    bait, fds = _bait_fds(tmp_path, sent)
    try:
        s = raw(daemon)
        hello(s)
        _send_with_fds(s, frame({"id": 2, "op": "ls", "args": {}}, nfds=declared), fds)
        err = only_error(read_until_close(s))
        assert f"declares {declared} fds but carried {sent}" in err["message"]
        s.close()
    finally:
        framing.close_fds(fds)
    assert_serving(daemon)
    wait_fds_back(daemon, baseline)
    assert bait not in fd_targets(pid)


def test_fds_riding_on_payload_bytes_are_not_kept(daemon, tmp_path):
    """fds attached to the payload rather than the header are not the frame's: the kernel
    drops them on the daemon's plain recv(), and the header's count (0) stands."""
    pid = daemon_pid(daemon)
    baseline = settled_fd_count(daemon)
    bait, fds = _bait_fds(tmp_path, 4)
    try:
        s = raw(daemon)
        hello(s)
        data = frame({"id": 2, "op": "ls", "args": {}})
        s.sendall(data[:framing.HEADER_SIZE])
        time.sleep(0.2)     # let the daemon consume the header on its own
        _send_with_fds(s, data[framing.HEADER_SIZE:], fds)
        framing.close_fds(fds)
        fds = []
        # Whatever the daemon makes of it (answer or close), it must not keep the fds.
        try:
            reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
            assert reply["id"] in (2, None)
        except (EOFError, ConnectionResetError):
            pass
        s.close()
    finally:
        framing.close_fds(fds)
    assert_serving(daemon)
    wait_fds_back(daemon, baseline)
    assert bait not in fd_targets(pid)


# ---- payloads that are not requests ----------------------------------------------------------

@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize("payload,expect", [
    (b"\xff\xfe not json at all", "not JSON"),
    (b'{"id": 1, "op": "hello", ', "not JSON"),
    (b"", "not JSON"),
    (b"[1, 2, 3]", "JSON object"),
    (b'"hello"', "JSON object"),
    (b"42", "JSON object"),
    (b"null", "JSON object"),
])
def test_payload_that_is_not_a_json_object(daemon, after_hello, payload, expect):
    s = raw(daemon)
    if after_hello:
        hello(s)
    s.sendall(frame(payload))
    err = only_error(read_until_close(s))
    assert expect in err["message"]
    s.close()
    assert_serving(daemon)


@pytest.mark.parametrize("after_hello", [False, True], ids=["before-hello", "after-hello"])
@pytest.mark.parametrize("payload", [b"[" * 200_000, b'{"a":' * 100_000],
                         ids=["deep-array", "deep-object"])
def test_deeply_nested_json_is_a_usage_error(daemon, after_hello, payload):
    """Deep nesting within the 1 MiB limit makes json.loads raise RecursionError (not a
    ValueError). It must be answered like any other malformed payload, not kill the daemon."""
    assert len(payload) <= framing.MAX_REQUEST_BYTES
    s = raw(daemon)
    if after_hello:
        hello(s)
    s.sendall(frame(payload))
    frames = read_until_close(s)
    s.close()
    assert_serving(daemon)
    only_error(frames)


# ---- the handshake ---------------------------------------------------------------------------

@pytest.mark.parametrize("op,args", [("ls", {}), ("create", {"path": "x", "size": 4096}),
                                     ("status", {})])
def test_request_before_hello(daemon, op, args):
    s = raw(daemon)
    s.sendall(frame({"id": 1, "op": op, "args": args}))
    err = only_error(read_until_close(s))
    assert "hello" in err["message"]
    s.close()
    assert_serving(daemon)
    with daemon.client() as c:
        assert c.ls() == []          # the refused create did not happen


@pytest.mark.parametrize("version", [0, 2, PROTOCOL_VERSION + 100, "1", None, 1.5, [1]])
def test_hello_with_a_wrong_version(daemon, version):
    s = raw(daemon)
    args = {} if version is None else {"version": version}
    s.sendall(frame({"id": 1, "op": "hello", "args": args}))
    err = only_error(read_until_close(s))
    assert "version" in err["message"]
    assert f"version {PROTOCOL_VERSION}" in err["message"]   # names the one it speaks
    s.close()
    assert_serving(daemon)


@pytest.mark.parametrize("args", [None, [], "v1", 1, [{"version": 1}]],
                         ids=["null", "empty-list", "string", "number", "list-of-object"])
def test_hello_with_args_that_are_not_an_object(daemon, args):
    """A hello whose 'args' is not an object is a malformed request: a usage error for that
    connection only. (It must not reach the daemon's task nursery as an AttributeError.)"""
    s = raw(daemon)
    s.sendall(frame({"id": 1, "op": "hello", "args": args}))
    frames = read_until_close(s)
    s.close()
    assert_serving(daemon)
    only_error(frames)


def test_second_hello_on_a_connection(daemon):
    s = raw(daemon)
    hello(s)
    reply = request(s, 2, "hello", version=PROTOCOL_VERSION)
    assert reply["ok"] is False and reply["error"]["code"] == USAGE
    assert request(s, 3, "ls")["ok"] is True
    s.close()
    assert_serving(daemon)


# ---- bad requests in good frames: answered, connection kept ----------------------------------

@pytest.mark.parametrize("msg", [
    {"id": 5, "op": "frobnicate", "args": {}},
    {"id": 5, "op": "_connection", "args": {}},
    {"id": 5, "op": "", "args": {}},
    {"id": 5, "op": 123, "args": {}},
    {"id": 5, "args": {}},
    {"id": 5, "op": "ls", "args": []},
    {"id": 5, "op": "ls", "args": "path"},
    {"id": 5, "op": "create", "args": {"path": "x", "size": "lots"}},
    {"id": 5, "op": "create", "args": {"path": ["x"], "size": 4096}},
    {"id": 5, "op": "create", "args": {"path": "x", "size": True}},
    {"id": 5, "op": "close", "args": {"handle": 99}},
], ids=["unknown", "private-name", "empty", "not-a-string", "missing", "args-list",
        "args-string", "size-string", "path-list", "size-bool", "close-unknown-handle"])
def test_bad_request_is_answered_and_connection_stays_usable(daemon, msg):
    s = raw(daemon)
    hello(s)
    s.sendall(frame(msg))
    reply, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
    assert fds == []
    assert reply["ok"] is False and reply["id"] == 5, reply
    expected = 4 if msg.get("op") == "close" else USAGE     # unknown handle: not found
    assert reply["error"]["code"] == expected, reply
    if msg.get("op") == "frobnicate":
        assert "frobnicate" in reply["error"]["message"]
    # the same connection goes on working
    ok = request(s, 6, "create", path="after-bad", size=4096)
    assert ok["ok"] is True and ok["id"] == 6, ok
    assert request(s, 7, "info", path="after-bad")["result"]["size"] == 4096
    assert request(s, 8, "rm", path="after-bad")["ok"] is True
    s.close()
    assert_serving(daemon)


def test_request_ids_are_echoed_whatever_their_type(daemon):
    s = raw(daemon)
    hello(s)
    for rid in ["abc", 2**62, None, {"nested": [1]}]:
        reply = request(s, rid, "ls")
        assert reply["ok"] is True and reply["id"] == rid
        reply = request(s, rid, "nope")
        assert reply["ok"] is False and reply["id"] == rid
    s.close()
    assert_serving(daemon)


# ---- many connections ------------------------------------------------------------------------

@pytest.mark.slabs_off   # 'shared' keeps memory of its own: the baseline's fds stay
def test_many_concurrent_connections_opened_and_dropped(daemon):
    """200 connections at once: some silent, some mid-hello, most with a session (and some of
    those holding leased allocations and read handles), all dropped abruptly. Sessions,
    leases and holders are released; the fd table returns to where it was."""
    with daemon.client() as c:
        c.create("shared", MiB, mode=0o644)
        c.write("shared", b"shared-bytes")
    baseline = settled_fd_count(daemon)
    conns: list[socket.socket] = []
    try:
        for _ in range(200):
            conns.append(raw(daemon))
        for i, s in enumerate(conns):
            if i % 10 == 0:
                continue                                   # connected, never says a word
            if i % 10 == 1:
                s.sendall(frame(HELLO)[:7])                # stops inside the hello header
                continue
            s.sendall(frame(HELLO))
        for i, s in enumerate(conns):
            if i % 10 >= 2:
                reply, _ = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
                assert reply["ok"] is True
        # all sessions ask at once, then collect the answers
        for i, s in enumerate(conns):
            if i % 10 in (2, 3):
                s.sendall(frame({"id": 2, "op": "create", "args": {
                    "path": f"leased/{i}", "size": 4096, "lease": True}}))
            elif i % 10 == 4:
                s.sendall(frame({"id": 2, "op": "open",
                                 "args": {"path": "shared", "mode": "r"}}))
            elif i % 10 >= 5:
                s.sendall(frame({"id": 2, "op": "ls", "args": {"path": ""}}))
        for i, s in enumerate(conns):
            if i % 10 >= 2:
                reply, fds = framing.recv_frame(s, framing.MAX_RESPONSE_BYTES)
                framing.close_fds(fds)
                assert reply["ok"] is True and reply["id"] == 2, reply
        with daemon.client() as c:
            totals = c.status()["totals"]
            assert totals["sessions"] >= 160
            assert len(c.ls("leased")) == 40
            assert c.info("shared")["refcount"] >= 20
    finally:
        for s in conns:
            s.close()
    assert_serving(daemon)

    def released():
        with daemon.client() as c:
            t = c.status()["totals"]
            return t["sessions"] == 1 and t["holders"] == 0 and c.ls("leased") == []
    wait_for(released, timeout=10, interval=0.1, what="sessions, leases and handles released")
    wait_fds_back(daemon, baseline)
    with daemon.client() as c:
        assert c.read("shared", 0, 12) == b"shared-bytes"


def test_burst_of_clients_all_connect(daemon):
    """300 Clients connecting at the same moment all get through. A Unix socket's connect()
    fails EAGAIN while the daemon's listen backlog is full, and Client connects with a
    timeout (non-blocking underneath): that must be retried, not reported as NotRunning
    ("daemon not running", exit 3) while the daemon is plainly running."""
    n = 300
    barrier = threading.Barrier(n)
    clients, errors, lock = [], [], threading.Lock()

    def connect():
        barrier.wait()
        try:
            c = Client(daemon.socket, timeout=30)
            with lock:
                clients.append(c)
        except Exception as exc:     # noqa: BLE001 - collected and asserted below
            with lock:
                errors.append(repr(exc))

    threads = [threading.Thread(target=connect) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == [], f"{len(errors)} of {n} connects failed, e.g. {errors[0]}"
        assert len(clients) == n
    finally:
        for c in clients:
            c.close()
    assert_serving(daemon)
