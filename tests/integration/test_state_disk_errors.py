"""Clear errors where a full state disk or a stopped keeper meets a request (issue 24, item
20). Before: a `scrub start` on a full state disk left the scrub shown running with 0 bytes
for good, refusing every later start; creates on a full state disk exited 70 (a bug, by the
table of exit codes) where nothing was wrong but the disk; and a durable create that met a
stopped keeper said `cannot make '' durable now`, naming nothing."""
from __future__ import annotations

import os
import signal

import pytest

from tests.harness import fill_filesystem, wait_for

NO_SPACE, BUSY = 7, 9


def one_line(proc) -> str:
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_scrub_started_on_a_full_state_disk_is_not_left_running(small_state_disk):
    d = small_state_disk
    d.cli("create", "data", "--size", "8M", check=True)
    filler = fill_filesystem(d.state_dir)
    try:
        start = d.cli("scrub", "--rate", "1G")
        assert start.returncode == NO_SPACE, start.stderr
        assert "no space" in one_line(start)
        status = d.cli_json("scrub", "status")
        assert not status.get("running"), status
    finally:
        os.remove(filler)
    assert d.cli("scrub", "--wait", "--quiet").returncode == 0      # space is back: it runs
    status = d.cli_json("scrub", "status")
    assert not status["running"] and status["last"]["totals"]["bytes"] == 8 << 20, status
    # `data`'s row may have been in a group commit the full disk rolled back: memory is the
    # truth, and the registry is rewritten from it within a second of space coming back.
    wait_for(lambda: d.cli("check").returncode == 0, timeout=10,
             what="check to be clean once the registry can be written")


def test_creates_on_a_full_state_disk_say_no_space_with_exit_7(small_state_disk):
    d = small_state_disk
    filler = fill_filesystem(d.state_dir)
    try:
        for args in (["create", "durable", "--size", "1M", "--durable"],
                     ["create", "a/b", "--size", "1M"], ["mkdir", "dir"]):
            proc = d.cli(*args)
            assert proc.returncode == NO_SPACE, (args, proc.returncode, proc.stderr)
            err = one_line(proc)
            assert "no space" in err and d.state_dir in err and "nothing was changed" in err
    finally:
        os.remove(filler)
    d.cli("create", "durable", "--size", "1M", "--durable", check=True)
    assert d.cli("check").returncode == 0


@pytest.mark.slabs_off
def test_a_durable_create_meeting_a_stopped_keeper_names_the_allocation(daemon):
    keeper = daemon.keeper_pid()
    os.kill(keeper, signal.SIGSTOP)
    try:
        for name in ("models/first", "models/second"):   # the wait, then refused at once
            proc = daemon.cli("create", name, "--size", "1M", "--durable")
            assert proc.returncode == BUSY, proc.stderr
            assert f"cannot make '{name}' durable" in one_line(proc)
    finally:
        os.kill(keeper, signal.SIGCONT)
    wait_for(lambda: daemon.cli("create", "models/third", "--size", "1M", "--durable")
             .returncode == 0, timeout=10, what="durable creates to work again")
