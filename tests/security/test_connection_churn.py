"""Connection churn (issue 24, item 10): uid 65534 at its max_connections_per_uid, connecting
and hanging up in a tight loop from 4 processes of 8 threads (tests/churn.py), while root's
`Client().ls("")`, a new connection each, is timed. Before, every refused connection cost a
task and a Connection, and root's connect waited in a 4096-long listen queue behind the
churn's: root's p50 was 230-400 ms, its p99 up to 2.5 s (9.9 s with a tighter loop).

What holds now (daemon/server/transport.py, Acceptor): a refused connection costs an
accept() and a close(); while they come in bulk the listen queue is short; each uid's new
connections are served at most max_connection_rate_per_uid a second. Every one of root's
requests is answered; the bounds below are generous (bench/churn.py measures the real
figures: p99 about 10-20 ms on a 2-core VM, bench/README.md)."""
from __future__ import annotations

import os

import pytest

from tests.churn import churn
from tests.harness import wait_for
from tests.soak import percentile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
PER_UID = 64
SECONDS = 5.0


def test_root_is_served_while_another_user_churns_connections(daemon_factory, tmp_path):
    config = tmp_path / "gpumemd.toml"
    config.write_text(f"max_connections_per_uid = {PER_UID}\n")
    d = daemon_factory(extra_args=["--config", str(config)])
    d.cli("create", "kept", "--size", "4K", check=True)
    result = churn(d.socket, SECONDS, PER_UID, processes=4, threads=8, hello=True)
    root = result["root"]
    assert result["workers"]["holder"] == {"held": PER_UID, "refused": 0}, result["workers"]
    assert result["connects"] > 10_000, result["connects"]        # it did churn
    assert root["failed"] == 0, root["errors"]
    assert len(root["times"]) > 20, len(root["times"])
    p50, p99 = percentile(root["times"], 0.50), percentile(root["times"], 0.99)
    assert p50 < 0.1 and p99 < 0.5, f"root's ls p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
    assert d.proc.poll() is None
    assert [e["path"] for e in d.cli_json("ls")] == ["kept"]
    wait_for(lambda: d.client().status()["totals"]["sessions"] == 1, timeout=10,
             what="the churn's sessions to end")
