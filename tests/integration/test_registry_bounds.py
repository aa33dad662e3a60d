"""The registry stays bounded (issue 13, item 4; docs/durability.md, "Bounds"): the WAL goes
back to nothing once the daemon is idle, event details keep to their schema and size, and
the event log keeps to a number of bytes as well as rows."""
from __future__ import annotations

import json
import os
import sqlite3

from daemon.core.events import DETAIL_LIMIT, LINE_PATH_LIMIT
from daemon.registry import WAL_LIMIT, Registry
from tests.harness import wait_for

MiB = 1 << 20


def wal_bytes(daemon) -> int:
    try:
        return os.path.getsize(os.path.join(daemon.state_dir, "registry.sqlite-wal"))
    except FileNotFoundError:
        return 0


def test_wal_stays_bounded_through_30000_mkdirs_and_empties_when_idle(daemon):
    """Each mkdir commits (directories outlive the daemon) and adds about 24 KiB of WAL;
    before the bound, 30,000 of them left an 885 MB WAL until shutdown."""
    peak = 0
    with daemon.client() as c:            # one connection, as a busy client would
        for i in range(30_000):
            c.mkdir(f"d{i // 1000}/e{i}", parents=True)
            if i % 250 == 0:
                peak = max(peak, wal_bytes(daemon))
    # The checkpoint runs within 0.1 s of the WAL passing WAL_LIMIT: what the daemon
    # writes meanwhile may go past it, never as far as twice the limit.
    assert 0 < peak <= 2 * WAL_LIMIT, peak
    wait_for(lambda: wal_bytes(daemon) == 0, timeout=15, what="the idle WAL to be truncated")
    with daemon.client() as c:            # nothing was lost on the way
        assert len(c.ls("d29")) == 1000
        assert c.info("d0/e0")["type"] == "directory"
        assert c.check()["clean"]


def last_event(daemon, kind: str) -> dict:
    events = [e for e in daemon.cli_json("events", "--limit", "50") if e["kind"] == kind]
    return events[-1]


def test_close_with_a_huge_written_object_stores_and_logs_a_bounded_event(daemon):
    junk = "x" * (900 * 1024)                    # as much as a request frame may carry
    registry = os.path.join(daemon.state_dir, "registry.sqlite")
    with daemon.client() as c:
        c.create("buf", MiB)
        before = os.path.getsize(registry) + wal_bytes(daemon)
        for written in ({"offset": 0, "bytes": 4096, "junk": junk},
                        {"offset": junk, "bytes": 1},
                        {"node": 1, "kind": "x", "cred": None, "offset": 2, "bytes": 3},
                        {"ranges": [[i * 8, i * 8 + 4] for i in range(40_000)]}):
            handle = c.open("buf", "rw")
            handle.memory.close()                 # unmap; the close below drops the lock
            handle.memory = None
            c.call("close", handle=handle.id, written=written)
        grown = os.path.getsize(registry) + wal_bytes(daemon) - before
    assert grown < 256 * 1024, grown                      # 2.5 MB if stored as sent
    writes = [e for e in daemon.cli_json("events") if e["kind"] == "write"]
    assert [e["detail"] for e in writes] == [
        {"offset": 0, "bytes": 4096, "dropped_keys": 1},  # the unknown key is gone
        {"bytes": 1, "dropped_keys": 1},                  # a string is no offset
        {"offset": 2, "bytes": 3, "dropped_keys": 3},     # no clash with _event's own
        {"ranges": {"count": 40_000, "bytes": 160_000, "first": [0, 4],
                    "last": [319_992, 319_996]}}]        # long range lists: a summary
    lines = [line for line in daemon.log().splitlines() if " event write buf " in line]
    assert len(lines) == 4 and all(len(line) < DETAIL_LIMIT for line in lines), \
        [len(line) for line in lines]
    assert "xxxx" not in daemon.log()


def test_long_strings_and_paths_are_cut_in_details_and_log_lines(daemon):
    """A rename's detail names both paths; a deep path is far longer than the limits."""
    names = [f"{i:03d}" + "n" * 200 for i in range(19)]     # 3.9 KiB: near MAX_PATH_BYTES
    deep = "/".join(names)
    with daemon.client() as c:
        c.mkdir(deep, parents=True)
    line = [x for x in daemon.log().splitlines() if " event mkdir " in x][-1]
    assert len(line) < LINE_PATH_LIMIT + 200 and "more characters]" in line
    event = last_event(daemon, "mkdir")
    assert event["path"] == deep                     # the stored path stays whole
    assert len(json.dumps(event["detail"])) <= DETAIL_LIMIT


def event_text_bytes(events: list[dict]) -> int:
    """What the byte bound counts: each event's detail (as JSON) and path."""
    return sum(len(json.dumps(e["detail"], sort_keys=True)) + len((e["path"] or "").encode())
               for e in events)


def all_events(daemon) -> list[dict]:
    out, since = [], 0
    with daemon.client() as c:
        while batch := c.events(since=since, limit=10_000):
            out += batch
            since = batch[-1]["id"]
    return out


def test_event_log_is_pruned_to_its_byte_bound(daemon_factory, tmp_path):
    """event_log_size (gpumemd.conf(5)) bounds the event log's text: each `mkdir -p`
    below logs 8 events with paths of up to 1.8 KiB, about 7 KiB in all, so 400 of them
    are nearly three times the 1 MiB allowed."""
    config = tmp_path / "gpumemd.toml"
    config.write_text('event_log_size = "1M"\n')
    d = daemon_factory(env={"GPUMEMD_CONFIG": str(config)})
    long_name = "n" * 250
    with d.client() as c:
        for i in range(400):
            c.mkdir(f"{i:05d}/{long_name}/{long_name}/{long_name}/{long_name}/{long_name}/"
                    f"{long_name}/{long_name}", parents=True)
    events = all_events(d)
    assert event_text_bytes(events) <= MiB
    assert event_text_bytes(events) > MiB // 2       # pruned to 3/4, not emptied
    assert events[0]["id"] > 1 and events[-1]["path"].startswith("00399/")
    ids = [e["id"] for e in events]
    assert ids == list(range(ids[0], ids[0] + len(ids)))     # the oldest went first
    d.restart()                                      # and the bound holds across restarts
    assert event_text_bytes(all_events(d)) <= MiB


def test_event_log_is_pruned_to_its_row_bound(tmp_path):
    """The row bound (MAX_EVENTS, 100,000 in the daemon) on a registry of its own: the
    daemon would need minutes to log that many events."""
    path = str(tmp_path / "r.sqlite")
    reg = Registry(path, max_events=200)
    for i in range(1000):
        with reg.transaction(durable=False):
            reg.event_log.add("mkdir", None, f"d{i}", 0, 1, {"mode": "0755"}, i)
    reg.close()
    db = sqlite3.connect(path)
    count, oldest, newest = db.execute("SELECT COUNT(*), MIN(id), MAX(id) FROM events")\
        .fetchone()
    db.close()
    assert newest == 1000 and count <= 200 and oldest == newest - count + 1
