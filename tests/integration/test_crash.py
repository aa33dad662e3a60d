"""Crashes: kill -9 of the daemon, of the keeper, of a client. What a user sees afterwards."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.harness import ROOT, child_env, wait_for
from tests.sizes import with_parity

MiB = 1 << 20


def pattern(seed: int, n: int) -> bytes:
    return hashlib.shake_256(seed.to_bytes(4, "little")).digest(n)


def fill(daemon, sizes: dict[str, int], durable: bool = True) -> dict[str, bytes]:
    data = {}
    with daemon.client() as c:
        for i, (name, size) in enumerate(sizes.items()):
            c.create(name, size, durable=durable, mode=0o640)
            data[name] = pattern(i, size)
            c.write(name, data[name])
    return data


def assert_intact(daemon, data: dict[str, bytes]) -> None:
    with daemon.client() as c:
        for name, expected in data.items():
            got = c.read(name)
            assert hashlib.sha256(got).hexdigest() == hashlib.sha256(expected).hexdigest(), name
            assert c.info(name)["state"] == "ready"
        assert c.check()["clean"], c.check()


SIZES = {"models/llama/weights": 5 * MiB + 3, "models/small": 4096, "kv/cache0": 2 * MiB,
         "x": 1}


def test_durable_survives_kill9_of_daemon(daemon):
    data = fill(daemon, SIZES)
    fill(daemon, {"scratch": MiB}, durable=False)
    before = {e["path"]: e for e in daemon.cli_json("ls", "-R")}
    daemon.kill9()
    assert os.path.exists(daemon.socket)            # the crash left a stale socket behind
    daemon.start()                                   # ... which the next start cleans up
    assert_intact(daemon, data)
    after = {e["path"]: e for e in daemon.cli_json("ls", "-R")}
    assert set(after) == set(before) - {"scratch"}   # the transient one is gone
    for path in after:
        for field in ("id", "size", "capacity", "mode", "uid", "gid", "durable", "created"):
            assert after[path].get(field) == before[path].get(field), (path, field)
    kinds = [e["kind"] for e in daemon.cli_json("events")]
    assert kinds.count("adopt") == len(SIZES) and "drop" in kinds


def test_durable_survives_repeated_crashes_and_clean_restarts(daemon):
    data = fill(daemon, {"a": 3 * MiB, "b": 77})
    for hard in (True, False, True, True, False):
        daemon.restart(hard=hard)
        assert_intact(daemon, data)
    assert daemon.keeper_pid() is not None


def test_clean_stop_keeps_durable_in_keeper_and_removes_socket(daemon):
    data = fill(daemon, {"keep": MiB})
    fill(daemon, {"temp": MiB}, durable=False)
    assert daemon.stop() == 0
    assert not os.path.exists(daemon.socket)
    keeper = daemon.keeper_pid()
    os.kill(keeper, 0)                               # still alive, holding the memory
    daemon.start()
    assert_intact(daemon, data)
    assert [e["path"] for e in daemon.cli_json("ls")] == ["keep"]


@pytest.mark.slabs_off
def test_keeper_killed_while_daemon_lives_is_restarted_and_refilled(daemon):
    data = fill(daemon, SIZES)
    old = daemon.keeper_pid()
    daemon.kill_keeper()

    def new_keeper_holding_all():
        k = daemon.cli_json("status")["keeper"]
        return k.get("alive") and k["pid"] != old and k["held"] == len(SIZES) and k
    keeper = wait_for(new_keeper_holding_all, 10, what="a new keeper holding every fd")
    assert daemon.keeper_pid() == keeper["pid"]
    assert "keeper" in [e["kind"] for e in daemon.cli_json("events")]
    # The new keeper really holds the memory: the daemon can now crash without loss.
    daemon.kill9()
    daemon.start()
    assert_intact(daemon, data)


def test_keeper_and_daemon_both_gone_means_lost_not_wrong(daemon):
    fill(daemon, {"a": MiB})
    daemon.kill9()
    daemon.kill_keeper()
    time.sleep(0.2)
    daemon.start()
    info = daemon.cli_json("info", "a")
    assert info["state"] == "lost"
    proc = daemon.cli("read", "a", check=10)
    assert b"lost" in proc.stderr and proc.stdout == b""
    daemon.cli("rm", "a", check=True)
    assert daemon.cli_json("check")["clean"]


LEASE_CLIENT = """
import sys, time
from gpumemctl import Client
c = Client(sys.argv[1])
c.create("leased/x", 1 << 20, lease=True)
h = c.open("leased/x", "rw")          # also an open handle, to be dropped by the crash
h.write(b"abc")
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slabs_off
def test_leased_transient_freed_within_1s_of_client_kill9(daemon):
    proc = subprocess.Popen([sys.executable, "-c", LEASE_CLIENT, daemon.socket],
                            stdout=subprocess.PIPE, env=child_env(), cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        info = daemon.cli_json("info", "leased/x")
        assert {h["kind"] for h in info["holders"]} == {"lease", "write"}
        assert info["refcount"] == 2
        used = daemon.cli_json("devices")[0]["ours"]
        assert used == with_parity(2 * MiB)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed = time.monotonic()
        with daemon.client() as c:
            wait_for(lambda: c.ls("leased") == [], 1.0, 0.01,
                     "the leased allocation to be freed")
            assert time.monotonic() - killed < 1.0
            assert c.devices()[0]["ours"] == 0
            assert "release" in [e["kind"] for e in c.events()]
    finally:
        proc.kill()


def test_unleased_transient_outlives_its_creator(daemon):
    daemon.cli("create", "t", "--size", "1M", check=True)     # the CLI exits right away
    assert daemon.cli_json("info", "t")["refcount"] == 0
    assert [e["path"] for e in daemon.cli_json("ls")] == ["t"]


def test_two_daemons_do_not_interfere(daemon_factory):
    a, b = daemon_factory(), daemon_factory()
    data_a = fill(a, {"same/name": MiB})
    data_b = fill(b, {"same/name": 3 * MiB, "only-b": 10})
    a.kill9()
    assert_intact(b, data_b)
    a.start()
    assert_intact(a, data_a)
    assert [e["path"] for e in a.cli_json("ls")] == ["same"]
    assert a.keeper_pid() != b.keeper_pid()


def test_second_daemon_on_same_state_dir_or_socket_is_refused(daemon, daemon_factory):
    from tests.harness import Daemon
    twin = Daemon(daemon.base)
    twin.start(wait=False)
    assert twin.proc.wait(20) == 1
    assert b"another gpumemd" in open(daemon.log_path, "rb").read()
    other = daemon_factory(start=False)
    other.socket = daemon.socket
    other.start(wait=False)
    assert other.proc.wait(20) == 1
    assert "another gpumemd is serving" in other.log()
    daemon.cli("ls", check=True)


@pytest.mark.slabs_off
def test_keeper_socket_removed_under_a_live_daemon(daemon):
    """Someone removes the keeper's socket (root's `rm`: the state directory is the
    daemon's alone, tests/security/test_paths.py): the keeper binds it again and goes on
    holding every fd; the daemon keeps serving and a restart finds it all. (Before, the
    keeper exited, freeing what it held, and the daemon re-deposited into a new one: memory
    lost had the daemon been down.)"""
    data = fill(daemon, SIZES)
    old = daemon.keeper_pid()
    sock = os.path.join(daemon.state_dir, "keeper.sock")
    os.unlink(sock)
    wait_for(lambda: os.path.exists(sock), 10, what="the keeper to bind its socket again")
    k = daemon.cli_json("status")["keeper"]
    assert k["alive"] and k["pid"] == old and k["held"] == len(SIZES), k
    assert "bound it again" in open(os.path.join(daemon.state_dir, "keeper.log")).read()
    assert daemon.proc.poll() is None
    daemon.kill9()
    daemon.start()
    assert daemon.keeper_pid() == old
    assert_intact(daemon, data)


def test_keeper_socket_removed_while_the_daemon_is_down(daemon):
    """The same with no daemon to re-deposit: the memory is still there at the next start."""
    data = fill(daemon, SIZES)
    daemon.stop()
    sock = os.path.join(daemon.state_dir, "keeper.sock")
    os.unlink(sock)
    wait_for(lambda: os.path.exists(sock), 10, what="the keeper to bind its socket again")
    daemon.start()
    assert_intact(daemon, data)
