"""`gpumemctl top` in a real terminal: tmux runs the console command, send-keys types,
capture-pane reads the screen (what an operator sees, end to end)."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid

import pytest

from tests.harness import child_env, script_argv

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (scripts/bootstrap.sh adds it)")


class Tmux:
    def __init__(self):
        self.server = f"gpumemctl-test-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.server, "-f", "/dev/null", *args],
                              capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top")

    def wait(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never showed; the screen:\n{self.screen()}")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "top", *keys)
        time.sleep(0.3)              # as a person types: one burst per call

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True)


def test_top_in_tmux(daemon):
    daemon.cli("create", "models/llama", "--size", "64M", "--durable", check=True)
    command = " ".join(shlex.quote(a) for a in
                       script_argv("gpumemctl") + ["--socket", daemon.socket, "top"])
    env = child_env({"TERM": "xterm-256color"})
    tmux = Tmux()
    try:
        subprocess.run(["tmux", "-L", tmux.server, "-f", "/dev/null", "new-session", "-d",
                        "-s", "top", "-x", "100", "-y", "30",
                        f"{command}; echo EXITED=$?; sleep 30"],
                       env=env, check=True)
        tmux.wait("models/")
        screen = tmux.wait("host backend")     # the banner may be drawn after the table
        assert "gpumemd 0.1.0" in screen and "host backend" in screen
        tmux.keys("Enter")                                  # into models/
        tmux.wait("llama")
        tmux.keys("c")                                      # the create form
        tmux.wait("Create an allocation")
        time.sleep(0.5)                                     # the form takes the focus
        tmux.keys("-l", "from-tmux")                        # after the prefilled models/
        tmux.keys("Tab")
        tmux.keys("-l", "3M")
        tmux.keys("Enter")
        tmux.wait("created models/from-tmux")
        info = daemon.cli_json("info", "models/from-tmux")
        assert info["size"] == 3 << 20
        tmux.keys("q")
        assert "EXITED=0" in tmux.wait("EXITED=")
    finally:
        tmux.kill()


def table_lines(screen: str) -> list[str]:
    """The lines of the allocations panel (the events panel names rows too)."""
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if "allocations ─" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
    return lines[start + 1:end]


def test_top_at_80x24(daemon):
    """docs/tui.md promises 80x24 (issue 27, item 6): End shows the last row above the
    horizontal scrollbar, the footer keeps Quit, Left moves the confirmation to Delete and
    Enter presses it, Esc leaves the filter so that q quits."""
    names = [f"row-{i:02d}" for i in range(30)]
    with daemon.client() as c:
        for name in names:
            c.create(name, 1 << 20)
    command = " ".join(shlex.quote(a) for a in
                       script_argv("gpumemctl") + ["--socket", daemon.socket, "top"])
    tmux = Tmux()
    try:
        subprocess.run(["tmux", "-L", tmux.server, "-f", "/dev/null", "new-session", "-d",
                        "-s", "top", "-x", "80", "-y", "24",
                        f"{command}; echo EXITED=$?; sleep 30"],
                       env=child_env({"TERM": "xterm-256color"}), check=True)
        screen = tmux.wait("row-00")
        time.sleep(0.5)                                      # the footer comes last
        footer = tmux.screen().rstrip("\n").splitlines()[-1]
        assert "s Scrub" in footer and "q Quit" in footer, footer
        tmux.keys("End")
        deadline = time.monotonic() + 10
        while not any("row-29" in line for line in table_lines(screen)):
            assert time.monotonic() < deadline, f"row-29 never showed:\n{screen}"
            time.sleep(0.1)
            screen = tmux.screen()
        tmux.keys("x")                                       # delete row-29: Cancel first
        tmux.wait("Free row-29")
        tmux.keys("Left")
        tmux.keys("Enter")                                   # Delete has the focus now
        tmux.wait("removed 1: row-29")
        assert daemon.cli("info", "row-29").returncode != 0
        tmux.keys("/")
        tmux.keys("-l", "row-1")
        tmux.wait("filter 'row-1'")
        tmux.keys("Escape")
        tmux.keys("q")                                       # a key again, not filter text
        assert "EXITED=0" in tmux.wait("EXITED=")
    finally:
        tmux.kill()


def test_top_refuses_without_a_terminal(daemon):
    proc = daemon.cli("top")
    assert proc.returncode == 2
    assert b"needs a terminal" in proc.stderr
    proc = daemon.cli("top", "--refresh", "0")
    assert proc.returncode == 2 and b"invalid --refresh 0" in proc.stderr
    proc = daemon.cli("top", "--json")
    assert proc.returncode == 2 and b"top is interactive" in proc.stderr
