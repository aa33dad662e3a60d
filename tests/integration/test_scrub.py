"""The background scrubber: repair, report, rate limit, stop, and resume after kill -9."""
from __future__ import annotations

import json
import os

import pytest

from tests.harness import wait_for

MiB, BLOCK = 1 << 20, 128 * 1024


@pytest.fixture
def d(daemon_factory):
    d = daemon_factory(extra_args=["--enable-fault-injection", "--host-capacity", "512M"])
    d.allow_errors = True          # uncorrectable damage is logged at ERROR, on purpose
    return d


def make(d, name, size=4 * MiB):
    data = os.urandom(size)
    d.cli("create", name, "--size", str(size), "--durable", check=True)
    d.cli("write", name, input=data, check=True)
    return data


def status(d) -> dict:
    return json.loads(d.cli("scrub", "status", "--json", check=True).stdout)


def test_scrub_repairs_and_reports(d):
    good = make(d, "a")
    make(d, "b")
    make(d, "plain", size=MiB)
    d.cli("debug", "corrupt", "a", "--offset", "1000", "--length", "3000", check=True)
    d.cli("debug", "corrupt", "b", "--offset", str(BLOCK), "--length", str(BLOCK),
          "--pattern", "77", check=True)
    assert status(d) == {"running": False, "last": None}
    assert d.cli("scrub", "status", check=True).stdout == b"scrub: none has run yet\n"
    out = d.cli("scrub", "--wait", check=8).stdout.decode().splitlines()
    assert out[0].startswith("scrub: finished ") and "9M scrubbed" in out[0]
    changed = sum(1 for x in good[1000:4000] if x != 0xFF)     # bytes the 0xff burst changed
    assert out[1] == f"  1 block(s) repaired ({changed} symbols), 1 uncorrectable, 0 skipped"
    assert "  b: 0 block(s) repaired (0 symbols), 1 uncorrectable, 0 skipped" in out
    assert d.cli("read", "a", check=True).stdout == good
    assert d.cli_json("info", "b")["state"] == "degraded"
    last = status(d)["last"]
    assert last["totals"]["bytes"] == 9 * MiB and not last["stopped"]
    assert {a["path"] for a in last["allocations"].values()} == {"a", "b", "plain"}
    summary = d.cli_json("status")["scrub"]
    assert summary["state"] == "idle" and summary["last"]["totals"]["uncorrectable"] == 1
    kinds = [(e["kind"], e["detail"].get("action")) for e in d.cli_json("events")]
    assert ("scrub", "start") in kinds and ("scrub", "finished") in kinds


def test_clean_scrub_is_quiet_for_cron(d):
    make(d, "a")
    assert d.cli("scrub", "--wait", "--quiet", check=0).stdout == b""
    assert status(d)["last"]["totals"]["corrected"] == 0
    # The pinned form `scrub start` (docs/design.md) is the same command.
    first = status(d)["last"]["finished_ns"]
    assert d.cli("scrub", "start", "--wait", "--quiet", check=0).stdout == b""
    assert status(d)["last"]["finished_ns"] > first


def test_unsealed_allocations_are_skipped(d):
    make(d, "a")
    with d.client() as c:
        with c.attach("a", "rw"):
            out = d.cli("scrub", "--wait", check=0).stdout.decode()
    assert "32 skipped" in out


def test_rate_limit_stop_and_resume_after_kill9(d):
    for name in ("a", "b", "c"):
        make(d, name, size=8 * MiB)
    d.cli("debug", "corrupt", "c", "--offset", "0", "--length", "10", check=True)
    d.cli("scrub", "--rate", "4M", check=True)                 # ~6 s for 24 MiB
    d.cli("scrub", check=10)                                   # one at a time (exit 10)
    st = wait_for(lambda: (s := status(d))["totals"]["bytes"] >= 2 * MiB and s,
                  timeout=20, what="the scrub to get going")
    assert st["running"] and 0 < st["progress"] < 1 and st["eta_seconds"] > 0
    text = d.cli("scrub", "status", check=True).stdout.decode()
    assert "in progress since" in text and "to go, rate limit 4M/s" in text
    wait_for(lambda: status(d)["position"]["id"] > 2 or None, timeout=20,
             what="the scrub to reach a later allocation")      # its state was saved
    reached = status(d)["position"]
    d.kill9()
    d.start()
    resumed = status(d)
    assert resumed["running"] and resumed["position"]["id"] >= reached["id"]
    assert "resuming the scrub at allocation" in d.log()
    final = wait_for(lambda: (s := status(d))["last"] and not s["running"] and s,
                     timeout=60, what="the resumed scrub to finish")
    t = final["last"]["totals"]
    assert t["corrected"] == 1 and t["uncorrectable"] == 0
    assert t["bytes"] <= 24 * MiB                                # not started over
    # stop
    d.cli("scrub", "--rate", "1M", check=True)
    d.cli("scrub", "stop", check=True)
    wait_for(lambda: status(d)["last"]["stopped"] or None, what="the scrub to stop")
    d.cli("scrub", "stop", check=10)                             # nothing to stop
