"""An error in a background task stops that task, never the daemon (issue 14). Before: with
the state disk filling, the scrubber's save raised `database or disk is full`, the exception
left its task, trio cancelled the daemon's other tasks and gpumemd stopped, freeing every
user's transient memory. Now the scrub ends as stopped with the error in `scrub status`
(and `scrub --wait` exits 70, not 0), the daemon serves on, and the next scrub runs once
space is back."""
from __future__ import annotations

import os
import subprocess

from tests.harness import child_env, fill_filesystem, script_argv, wait_for

INTERNAL = 70


def test_a_scrub_meeting_a_full_state_disk_stops_itself_not_the_daemon(small_state_disk):
    d = small_state_disk
    d.cli("create", "data", "--size", "32M", check=True)
    d.cli("create", "keep", "--size", "1M", check=True)             # transient memory
    d.cli("scrub", "--rate", "2M", check=True)                       # slow: about 16 s
    filler = fill_filesystem(d.state_dir)
    try:
        wait_for(lambda: not d.cli_json("scrub", "status").get("running"), timeout=20,
                 what="the scrub to stop on the full disk")
        status = d.cli_json("scrub", "status")
        assert "full" in status["last"]["error"], status["last"]
        assert d.proc.poll() is None, "gpumemd stopped"
        text = d.cli("scrub", "status").stdout.decode()
        assert "failed:" in text and "full" in text
        assert d.cli("ls").returncode == 0
    finally:
        os.remove(filler)
    assert sorted(e["path"] for e in d.cli_json("ls")) == ["data", "keep"]
    assert d.cli("scrub", "--wait", "--quiet").returncode == 0        # the next one runs
    assert d.cli("check").returncode == 0


def test_scrub_wait_on_a_scrub_that_failed_exits_70_not_0(small_state_disk):
    """A cron job's `scrub --wait` must not read a scrub that never finished as clean."""
    d = small_state_disk
    d.cli("create", "data", "--size", "32M", check=True)
    cron = subprocess.Popen([*script_argv("gpumemctl"), "--socket", d.socket, "scrub",
                             "--wait", "--rate", "2M"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env(None))
    wait_for(lambda: d.cli_json("scrub", "status").get("running"), timeout=20,
             what="the scrub to start")
    filler = fill_filesystem(d.state_dir)
    try:
        out, err = cron.communicate(timeout=60)
    finally:
        os.remove(filler)
    assert cron.returncode == INTERNAL, (out, err)
    assert b"failed:" in out
