"""gpumemd's log: exactly one line at info per event-log entry; under journald (stderr is
the stream $JOURNAL_STREAM names) no timestamp and "<N>" priority prefixes."""
from __future__ import annotations

import os
import re

from tests.harness import wait_for

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} gpumemd\[\d+\] ")


def exercise(d) -> int:
    """Changes of many kinds, one odd name among them; returns the last event id."""
    d.cli("create", "a/b", "--size", "1M", "--durable", check=True)
    d.cli("mkdir", "dir", check=True)
    d.cli("transient", "a/b", check=True)
    with d.client() as c:
        c.create("we\nird name", 4096)         # a newline in a name must not split a line
    d.cli("rm", "-r", "a", check=True)
    return d.cli_json("events", "-n", "1000")[-1]["id"]


def event_lines(log: str, marker: str) -> list[str]:
    return [line for line in log.splitlines() if marker in line]


def test_one_line_per_event_under_journald(daemon_factory):
    d = daemon_factory(start=False)
    open(d.log_path, "wb").close()            # the stream systemd would have connected
    st = os.stat(d.log_path)
    d.extra_env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    d.start()
    exercise(d)
    events = d.cli_json("events", "-n", "1000")
    wait_for(lambda: len(event_lines(d.log(), "<6>INFO: event ")) >= len(events),
             what="event lines in the log")
    log = d.log()
    lines = event_lines(log, "<6>INFO: event ")
    assert len(lines) == len(events)
    assert [line.split()[2] for line in lines] == [e["kind"] for e in events]
    assert any(' we\\nird name ' in line for line in lines)   # escaped by the formatter
    for line in log.splitlines():              # every line: a priority, no timestamp
        assert re.match(r"^<[0-7]>[A-Z]+: ", line), line
        assert not TIMESTAMP.match(line[3:]), line


def test_timestamps_kept_when_stderr_is_not_the_journal(daemon_factory):
    d = daemon_factory(env={"JOURNAL_STREAM": "1:2"})   # inherited, but stderr is a file
    exercise(d)
    events = d.cli_json("events", "-n", "1000")
    wait_for(lambda: len(event_lines(d.log(), " INFO: event ")) >= len(events),
             what="event lines")
    lines = event_lines(d.log(), " INFO: event ")
    assert len(lines) == len(events)
    assert all(TIMESTAMP.match(line) for line in lines), lines[:3]
    assert any(' we\\nird name ' in line for line in lines)   # escaped by the formatter
    # (log_level from the configuration file: tests/integration/test_config.py)

