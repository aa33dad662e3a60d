"""The shared-server soak (issue 14): three unprivileged uids doing random operations against
one root gpumemd while one of them also floods connections and kill -9s its own clients, and
root's requests timed all along. tests/security/test_soak.py asserts what must hold (the
daemon stays up, nobody gets an internal error, `check` is clean); bench/soak.py prints root's
latencies as a table (timings are measured there, never asserted).

Workers are forked children that drop to their uid first (as tests/users.py does) and report
counts through a pipe as JSON. Standard library and the client library only.
"""
from __future__ import annotations

import errno
import json
import mmap  # noqa: F401 - Client.open maps memory; nothing may be imported after the drop
import os
import random
import signal
import socket
import time
import typing  # noqa: F401 - the client imports it lazily; nothing may be imported after the drop

from gpumemctl import Client
from gpumemctl.protocol import GpumemError, NotRunning

USERS = (65534, 4243, 4244)          # the last one also floods and kill -9s its clients
INTERNAL = 70
SIZES = (4096, 64 << 10, 1 << 20)


def _fork_as(uid: int, fn, *args) -> tuple[int, int]:
    """A child as `uid` running fn(*args) -> dict; returns (pid, read end of its report)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        out: dict = {}
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = {"crash": f"{type(exc).__name__}: {exc}"}
        finally:
            try:
                data = json.dumps(out).encode()
                while data:
                    data = data[os.write(w, data):]
            finally:
                os._exit(0)             # never back into the caller's code, whatever failed
    os.close(w)
    return pid, r


def _collect(pid: int, r: int) -> dict:
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    os.waitpid(pid, 0)
    return json.loads(raw) if raw else {"crash": "no report"}


class Tally:
    """What a worker did: each operation's count, and each error code it met."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.codes: dict[str, int] = {}
        self.internal: list[str] = []
        self.first: dict[str, str] = {}     # the first message of each code, to read

    def run(self, name: str, fn, *args, **kw) -> object:
        self.ops[name] = self.ops.get(name, 0) + 1
        try:
            return fn(*args, **kw)
        except GpumemError as exc:
            self.codes[str(exc.code)] = self.codes.get(str(exc.code), 0) + 1
            self.first.setdefault(str(exc.code), f"{name}: {exc}")
            if exc.code == INTERNAL or isinstance(exc, NotRunning):
                self.internal.append(f"{name}: {exc}")
        except OSError as exc:               # the mount's answers: errno, never a crash
            key = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            self.codes[key] = self.codes.get(key, 0) + 1
            if exc.errno in (errno.EIO, errno.ENOTCONN):
                self.internal.append(f"{name}: {exc}")
        return None

    def report(self) -> dict:
        return {"ops": self.ops, "codes": self.codes, "internal": self.internal[:20],
                "first": self.first}


def _random_ops(sock: str, mnt: str | None, uid: int, deadline: float, seed: int) -> dict:
    """Create, write, open, rm, mkdir, rename (through the mount), verify; now and then a
    try at someone else's names. Every error but an internal one is an answer."""
    rnd, tally = random.Random(seed), Tally()
    c = Client(sock, timeout=60)
    home = f"u{uid}"
    tally.run("mkdir", c.mkdir, home, mode=0o755)
    names: list[str] = []
    while time.monotonic() < deadline:
        op = rnd.choice(("create", "create", "write", "open", "rm", "mkdir", "rename",
                         "verify", "info", "others"))
        name = f"{home}/n{rnd.randrange(40)}"
        if op == "create":
            if tally.run("create", c.create, name, rnd.choice(SIZES), mode=0o644,
                         durable=rnd.random() < 0.3) is not None:
                names.append(name)
        elif op == "write" and names:
            tally.run("write", c.write, rnd.choice(names), os.urandom(rnd.randrange(1, 8192)))
        elif op == "open" and names:
            h = tally.run("open", c.open, rnd.choice(names), rnd.choice(("r", "rw")))
            if h is not None:
                tally.run("close", h.close)
        elif op == "rm" and names:
            tally.run("rm", c.remove, names.pop(rnd.randrange(len(names))), force=True)
        elif op == "mkdir":
            tally.run("mkdir", c.mkdir, f"{home}/d{rnd.randrange(10)}/e", parents=True)
        elif op == "rename" and names and mnt:
            src = names.pop(rnd.randrange(len(names)))
            dst = f"{home}/n{rnd.randrange(40)}"
            if tally.run("rename", os.rename, f"{mnt}/{src}", f"{mnt}/{dst}") is None:
                names.append(dst)
        elif op == "verify" and names:
            tally.run("verify", c.verify, [rnd.choice(names)])
        elif op == "info":
            tally.run("info", c.ls, home, recursive=True)
        elif op == "others":
            other = rnd.choice([u for u in USERS if u != uid])
            tally.run("others", c.open, f"u{other}/n{rnd.randrange(40)}", "rw")
    c.close()
    return tally.report()


def _victim(sock: str, names: list[str]) -> None:
    """A client that takes what it can and is then killed: handles, attachments, leases."""
    try:
        c = Client(sock, timeout=30)
        held = []
        for name in names:
            try:
                held.append(c.open(name, "r"))
                c.create(f"{name}-lease{os.getpid()}", 4096, lease=True)
            except GpumemError:
                pass
        time.sleep(30)
    finally:
        os._exit(0)


def _flood_and_kill(sock: str, uid: int, deadline: float, seed: int) -> dict:
    """Hold as many connections as the daemon lets this uid have, let go, again; meanwhile
    fork clients that hold handles and leases and kill -9 them."""
    rnd, tally = random.Random(seed), Tally()
    c = Client(sock, timeout=60)
    home = f"u{uid}-victims"
    tally.run("mkdir", c.mkdir, home, mode=0o755)
    targets = [f"{home}/v{i}" for i in range(4)]
    for name in targets:
        tally.run("create", c.create, name, 1 << 20, durable=True)
    floods = kills = 0
    while time.monotonic() < deadline:
        held = []
        for _ in range(400):                     # past max_connections_per_uid (256)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock)
            except OSError:
                s.close()
                break
            held.append(s)
        floods += 1
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                _victim(sock, targets)
            time.sleep(rnd.uniform(0.01, 0.2))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            kills += 1
        for s in held:
            s.close()
    c.close()
    report = tally.report()
    report.update(floods=floods, kills=kills)
    return report


def _root_probe(sock: str, deadline: float, interval: float = 0.01) -> dict:
    """Root's requests all along, one every `interval` (`info`, `ls`, `status` in turn),
    each timed from when it fell due: a stalled daemon delays every call due meanwhile, not
    only the one in flight (bench/loop.py says why)."""
    c = Client(sock, timeout=60)
    c.create("root-probe", 4096, exist_ok=True)
    calls = (lambda: c.info("root-probe"), lambda: c.ls(""), c.status)
    times, errors = [], []
    due, i = time.perf_counter(), 0
    while time.monotonic() < deadline:
        time.sleep(max(0.0, due - time.perf_counter()))
        try:
            calls[i % len(calls)]()
        except GpumemError as exc:
            errors.append(str(exc))
        end, i = time.perf_counter(), i + 1
        while due < end:
            times.append(end - due)
            due += interval
    c.close()
    return {"times": times, "errors": errors[:20]}


def quiet_probe(sock: str, seconds: float) -> dict:
    """The baseline: root's requests with nothing else going on."""
    return _root_probe(sock, time.monotonic() + seconds)


def soak(sock: str, mnt: str | None, seconds: float, seed: int = 14) -> dict:
    """Run the workload for `seconds`; returns each uid's report and root's latencies."""
    deadline = time.monotonic() + seconds
    children = []
    for i, uid in enumerate(USERS):
        children.append((uid, *_fork_as(uid, _random_ops, sock, mnt, uid, deadline, seed + i)))
    flooder = USERS[-1]
    children.append((f"{flooder}-flood",
                     *_fork_as(flooder, _flood_and_kill, sock, flooder, deadline, seed + 9)))
    root = _root_probe(sock, deadline)
    reports = {str(who): _collect(pid, r) for who, pid, r in children}
    return {"users": reports, "root": root}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
