"""`snapshot_report` events belong to their reporter (issue 24, item 14).

A report is an event with no node, and node-less events were shown to everyone as the
daemon's own: every user saw each other's reports (a store location inside another user's
tree leaked), and one uid's 23,000 reports filled every other user's `events --since 0`
(the newest `limit`), pushing their own events out of it. A report is now delivered only
to its reporter and the administrator (root, the daemon's uid, admin_group), in answers and
in streams, and it counts against its reporter's share of the event log
(EVENT_SHARE_PER_UID), as the reporter's other events do. Run as uids 65534 and 65533."""
from __future__ import annotations

import os
import threading

import pytest

from daemon.registry import EVENT_SHARE_PER_UID
from gpumemctl import Client
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

OTHER = 65533                          # a second user, with events of its own
SECRET = "/home/nobody/.private/SECRET-STORE"
REPORTS = 300                          # more than the 100 newest `events` shows by default


def _report(sock: str, n: int, location: str = SECRET) -> int:
    with Client(sock) as c:
        for i in range(n):
            c.call("snapshot_report", action="create", result="ok", location=location,
                   snapshot=f"snap-{i}", bytes=i)
    return n


def _own_events(sock: str, tag: str = "") -> dict:
    with Client(sock) as c:
        c.mkdir(f"mine-{os.getuid()}{tag}")
    return {}


def _events_since_0(sock: str) -> list[dict]:
    with Client(sock) as c:
        return c.events(since=0)                 # the CLI's default: the newest 100


def test_reports_reach_only_their_reporter_and_root(daemon):
    run_as(_own_events, daemon.socket, uid=OTHER, gid=OTHER)
    run_as(_report, daemon.socket, REPORTS)

    seen = run_as(_events_since_0, daemon.socket, uid=OTHER, gid=OTHER)
    assert [e["path"] for e in seen if e["uid"] == OTHER] == [f"mine-{OTHER}"]
    assert not [e for e in seen if e["uid"] == NOBODY], "another user's reports were shown"
    assert SECRET not in str(seen)
    assert any(e["kind"] == "start" for e in seen)          # the daemon's own still are

    theirs = run_as(_events_since_0, daemon.socket)          # the reporter sees its own
    assert [e["detail"]["snapshot"] for e in theirs if e["kind"] == "snapshot"] == \
        [f"snap-{i}" for i in range(REPORTS - 100, REPORTS)]
    with daemon.client() as c:                               # and root sees every one
        kinds = [(e["kind"], e["uid"]) for e in c.events(since=0, limit=10_000)]
    assert kinds.count(("snapshot", NOBODY)) == REPORTS
    shown = daemon.cli("events", "--since", "0", "--limit", "10000")
    assert SECRET.encode() in shown.stdout


def _follow(sock: str, ready_w: int, go_r: int, tag: str) -> list[dict]:
    """Subscribe, let the others act, then make an event of one's own and return every
    event the stream delivered up to it."""
    c = Client(sock)
    stream = c.subscribe()
    os.write(ready_w, b"r")
    os.read(go_r, 1)
    _own_events(sock, tag)
    got = []
    for item in stream:
        if item["type"] == "event":
            got.append(item["event"])
            if item["event"]["path"] == f"mine-{os.getuid()}{tag}":
                break
    c.close()
    return got


def _streamed_while_reporting(sock: str, uid: int, tag: str, groups=()) -> list[dict]:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out: list = []
    follower = threading.Thread(target=lambda: out.append(run_as(
        _follow, sock, ready_w, go_r, tag, uid=uid, gid=uid, groups=groups)))
    follower.start()
    try:
        assert os.read(ready_r, 1) == b"r"
        run_as(_report, sock, 5)
    finally:
        os.write(go_w, b"g")
        follower.join(60)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)
    return out[0]


def test_streams_deliver_reports_to_the_reporter_and_the_administrator(daemon_factory,
                                                                          tmp_path):
    config = tmp_path / "gpumemd.toml"
    config.write_text("admin_group = 65532\n")
    d = daemon_factory(extra_args=["--config", str(config)])
    streamed = _streamed_while_reporting(d.socket, OTHER, "-plain")
    assert [e["kind"] for e in streamed] == ["mkdir"]       # only its own, no reports
    admin = _streamed_while_reporting(d.socket, OTHER, "-admin", groups=(65532,))
    assert [e["kind"] for e in admin] == ["snapshot"] * 5 + ["mkdir"]
    assert admin[0]["detail"]["location"] == SECRET
    backlog = run_as(_events_since_0, d.socket, uid=OTHER, gid=OTHER, groups=(65532,))
    assert [e["uid"] for e in backlog if e["kind"] == "snapshot"] == [NOBODY] * 10


def test_reports_count_against_their_reporters_share(daemon_factory, tmp_path):
    """Past its share of the log, a reporter's oldest reports go; another user's events and
    root's stay."""
    size = 64 << 10
    config = tmp_path / "gpumemd.toml"
    config.write_text(f'event_log_size = "{size >> 10}K"\n')
    d = daemon_factory(extra_args=["--config", str(config)])
    run_as(_own_events, d.socket, uid=OTHER, gid=OTHER)
    d.cli("mkdir", "roots", check=True)
    long_location = "/stores/" + "x" * 900                   # ~1.1 KB an event
    run_as(_report, d.socket, 200, long_location)           # 220 KB: 3.4 times the log
    with d.client() as c:
        events = c.events(since=0, limit=10_000)
    reports = [e for e in events if e["kind"] == "snapshot"]
    held = sum(len(e["detail"]["location"]) for e in reports)
    assert 0 < held <= size * EVENT_SHARE_PER_UID
    assert reports[-1]["detail"]["snapshot"] == "snap-199"   # the newest kept
    assert [e["path"] for e in events if e["kind"] == "mkdir"] == [f"mine-{OTHER}", "roots"]
    seen = run_as(_events_since_0, d.socket, uid=OTHER, gid=OTHER)
    assert [e["path"] for e in seen if e["kind"] == "mkdir"] == [f"mine-{OTHER}"]
