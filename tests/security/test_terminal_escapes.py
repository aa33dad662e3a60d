"""Names and details with control characters reach no terminal raw (issue 14).

Before: uid 65534 made names holding a newline, `\\r`, an OSC title or clear-screen, and
root's `gpumemctl ls` printed a forged `root-owned-fake 0:0` line and live escapes; so did
`events`, `info`, error messages that quote a name, and one daemon log line. Now every human
output escapes control characters by one rule (gpumemctl/protocol/escape.py: `\\n`, `\\x1b`,
`\\\\` for a backslash); `--json` stays exact."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.open maps memory; nothing is imported after the uid drop
import os
import re

import pytest

from gpumemctl import Client
from gpumemctl.protocol.escape import escape
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

FORGED = "root-owned-fake 0:0"
NAMES = [
    f"evil\n{FORGED}",                         # a forged line
    f"cr\r{FORGED}",                           # overwrites the line it is on
    "title\x1b]0;pwned by nobody\x07",         # an OSC window title
    "clear\x1b[2J\x1b[H",                      # clear-screen
    "csi\x9b31mred",                           # a C1 control (8-bit CSI)
    "bidi\u202eexe.txt",                       # a right-to-left override
    "back\\nslash",                            # a literal backslash-n: not a newline
]
# Raw controls nothing may print: C0 but the line break, DEL, C1, bidi overrides.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _make_names(sock: str) -> list[str]:
    c = Client(sock, timeout=20)
    for name in NAMES:
        c.create(name, 4096, mode=0o644)
    handle = c.open(NAMES[0], "rw")           # a close that reports text in its detail
    handle.memory.close()
    handle.memory = None
    c.call("close", handle=handle.id, written={"offset": 0, "bytes": 5,
                                               "note": f"\n{FORGED}\x1b[2J",
                                               "ranges": "\x1b]0;x\x07"})
    c.close()
    return [e["path"] for e in Client(sock, timeout=20).ls("")]


def assert_clean(text: str, what: str) -> None:
    assert not RAW.search(text), f"{what} printed a raw control character: {text!r}"
    assert not any(line.startswith(FORGED) or line.startswith(" " + FORGED)
                   for line in text.splitlines()), f"{what} printed a forged line: {text!r}"


def test_names_from_another_user_are_escaped_in_every_human_output(daemon):
    made = run_as(_make_names, daemon.socket)
    assert sorted(made) == sorted(NAMES)       # the daemon takes them: names are bytes

    ls = daemon.cli("ls", check=True).stdout.decode()
    assert_clean(ls, "ls")
    assert sorted(ls.splitlines()) == sorted(escape(n) for n in NAMES)   # one line each
    assert "back\\\\nslash" in ls and "evil\\nroot-owned-fake" in ls      # unambiguous
    long = daemon.cli("ls", "-l", check=True).stdout.decode()
    assert_clean(long, "ls -l")
    assert len(long.splitlines()) == len(NAMES) + 1

    events = daemon.cli("events", "--limit", "100", check=True).stdout.decode()
    assert_clean(events, "events")
    assert "title\\x1b]0;pwned by nobody\\x07" in events
    write = [line for line in events.splitlines() if " write " in line]
    assert len(write) == 1 and write[0].endswith("bytes=5 dropped_keys=2 offset=0")

    for name in NAMES:
        info = daemon.cli("info", name, check=True).stdout.decode()
        assert_clean(info, "info")
        assert f"path               {escape(name)}\n" in info
    for bad in (f"gone\n{FORGED}\x1b[2J", f"gone\n{FORGED}\x1b[2J/./x"):   # missing; invalid
        failed = daemon.cli("info", bad)
        assert failed.returncode != 0
        error = failed.stderr.decode()
        assert_clean(error, "an error message")
        assert error.count("\n") == 1 and "'gone\\nroot-owned-fake 0:0\\x1b[2J" in error

    assert_clean(daemon.log(), "the daemon's log")


def test_json_output_stays_exact(daemon):
    run_as(_make_names, daemon.socket)
    assert sorted(e["path"] for e in daemon.cli_json("ls")) == sorted(NAMES)
    assert daemon.cli_json("info", NAMES[2])["path"] == NAMES[2]


def test_the_monitor_shows_them_escaped(daemon):
    pytest.importorskip("textual")
    from tests.tui.driving import live_app, notifications, run_app, table_rows, until
    from tui.widgets.events import EventsPanel
    run_as(_make_names, daemon.socket)
    app = live_app(daemon)

    async def scenario(pilot):
        await until(pilot, lambda: sorted(table_rows(app)) == sorted(map(escape, NAMES)),
                    what="the escaped names", explain=lambda: table_rows(app))
        table = app.main.query_one("#alloc-table")
        drawn = "\n".join(table.render_line(y).text for y in range(len(NAMES) + 1))
        panel = app.main.query_one(EventsPanel)
        await until(pilot, lambda: len(panel.lines) >= len(NAMES), what="the events")
        events = "\n".join(strip.text for strip in panel.lines)
        detail = str(app.main.query_one("#detail-body").render())
        app.notify(f"removed {NAMES[0]}")        # as the actions' notifications quote names
        await until(pilot, lambda: notifications(app), what="the notification")
        return drawn, events, detail, notifications(app)
    drawn, events, detail, notes = run_app(app, scenario)
    assert_clean(drawn, "the monitor's table")
    assert_clean(events, "the monitor's events")
    assert "title\\x1b]0;pwned by nobody\\x07" in events
    assert_clean(detail, "the monitor's detail")
    assert notes == [f"removed {escape(NAMES[0])}"]
