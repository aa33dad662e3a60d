"""The shared-server soak (issue 14, "Done when"): three uids doing random operations (create,
write, open, rm, mkdir, rename through the mount, verify, tries at each other's names) for 60 s
while one of them floods connections and kill -9s its own clients (tests/soak.py). The daemon
stays up, nobody meets an internal error, root is answered every time, and `check` is clean
afterwards. Root's latencies are a benchmark (bench/soak.py), not asserted here.
GPUMEMD_SOAK_SECONDS shortens or lengthens it."""
from __future__ import annotations

import os

import pytest

from tests.soak import soak

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
SECONDS = float(os.environ.get("GPUMEMD_SOAK_SECONDS", "60"))


def test_three_users_a_flood_and_kill9s_leave_the_daemon_up_and_consistent(mounted):
    d = mounted
    result = soak(d.socket, d.mnt, SECONDS)
    for who, report in result["users"].items():
        assert "crash" not in report, (who, report)
        assert report["internal"] == [], (who, report)
    for uid in ("65534", "4243", "4244"):                # each did a lot, most of it working
        report = result["users"][uid]
        done, failed = sum(report["ops"].values()), sum(report["codes"].values())
        assert done > 100 and failed < done / 2, (uid, report)
    flood = result["users"]["4244-flood"]
    assert flood["floods"] >= 1 and flood["kills"] >= 4
    assert result["root"]["errors"] == [] and len(result["root"]["times"]) > 100
    assert d.proc.poll() is None                      # still running
    c = d.client()
    assert c.check()["clean"] is True, c.check()
    assert c.status()["totals"]["sessions"] < 10      # the killed clients' sessions ended
    assert "internal error" not in d.log()
