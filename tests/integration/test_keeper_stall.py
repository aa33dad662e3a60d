"""A keeper that stops answering (SIGSTOP here; a debugger or CPU starvation in life) costs
one durable request a bounded wait, refuses later durable changes at once with 'busy', leaves
everything else served, and is taken back without a restart once it answers again: what it
holds is reconciled with the registry (daemon/keeper_link.KeeperStalled,
daemon/main.resume_stalled_keeper)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from daemon.keeper.link import CALL_TIMEOUT
from tests.harness import child_env, script_argv, wait_for

pytestmark = pytest.mark.slabs_off   # per-allocation keeper deposits and descriptors

BUSY = 9


def timed(daemon, *args):
    start = time.monotonic()
    proc = daemon.cli(*args)
    return proc, time.monotonic() - start


def test_a_stopped_keeper_costs_one_bounded_wait_and_comes_back(daemon):
    daemon.cli("create", "a", "--size", "1M", "--durable", check=True)
    daemon.cli("write", "a", "-", input=b"kept through the stall", check=True)
    keeper = daemon.keeper_pid()
    os.kill(keeper, signal.SIGSTOP)
    try:
        first, waited = timed(daemon, "create", "b", "--size", "1M", "--durable")
        assert first.returncode == BUSY, first.stderr
        assert b"keeper" in first.stderr
        assert waited < CALL_TIMEOUT + 5

        again, waited = timed(daemon, "create", "c", "--size", "1M", "--durable")
        assert again.returncode == BUSY, again.stderr          # refused at once now
        assert waited < CALL_TIMEOUT
        listing, waited = timed(daemon, "ls", "--json")       # everything else is served
        assert listing.returncode == 0 and waited < CALL_TIMEOUT
        daemon.cli("create", "t", "--size", "1M", check=True)  # transient: no keeper needed
    finally:
        os.kill(keeper, signal.SIGCONT)

    wait_for(lambda: daemon.cli("create", "d", "--size", "1M", "--durable").returncode == 0,
             timeout=10, what="a durable create to work again once the keeper answers")
    assert daemon.keeper_pid() == keeper                      # the same keeper, no restart
    names = sorted(e["path"] for e in daemon.cli_json("ls"))
    assert names == ["a", "d", "t"]                           # b and c were never made
    assert daemon.cli_json("status")["keeper"]["held"] == 2   # a and d: nothing stale kept
    assert daemon.cli("check").returncode == 0

    daemon.restart(hard=True)                                 # the kept memory is right
    assert daemon.cli("read", "a", "--length", "22", check=True).stdout == \
        b"kept through the stall"
    assert daemon.cli_json("info", "d")["state"] == "ready"


def test_a_stalled_keeper_holds_only_the_requests_that_need_it(daemon):
    """While a durable create waits on a stopped keeper, another client's `ls` is answered
    at once: the deposit waits on a worker thread, not on the event loop. Once the keeper
    answers again, a durable create works without a restart."""
    keeper = daemon.keeper_pid()
    os.kill(keeper, signal.SIGSTOP)
    try:
        waiting = subprocess.Popen(
            [*script_argv("gpumemctl", daemon.installed), "--socket", daemon.socket,
             "create", "b", "--size", "1M", "--durable"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(None))
        time.sleep(0.5)                        # its deposit is in flight now
        assert waiting.poll() is None, "the durable create did not wait for the keeper"
        start = time.monotonic()              # connecting is answered by the loop too
        with daemon.client() as other:
            other.ls("", recursive=True)
        listing = time.monotonic() - start
        assert listing < 1.0, f"ls took {listing:.2f} s while the keeper was stopped"
        _out, err = waiting.communicate(timeout=CALL_TIMEOUT + 10)
        assert waiting.returncode == BUSY, err
    finally:
        os.kill(keeper, signal.SIGCONT)
    wait_for(lambda: daemon.cli("create", "d", "--size", "1M", "--durable").returncode == 0,
             timeout=10, what="a durable create to work again once the keeper answers")
    assert daemon.keeper_pid() == keeper
    assert [e["path"] for e in daemon.cli_json("ls")] == ["d"]
    assert daemon.cli_json("status")["keeper"]["held"] == 1
    assert daemon.cli("check").returncode == 0
