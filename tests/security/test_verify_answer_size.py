"""A user's allocations must not make root's `verify --all` fail (issue 24: the same hole as
item 7's listing, found while fixing it).

`verify --all` answers one result per allocation, each naming it. uid 65534's 2,800 small
allocations whose paths are 4,080 bytes that are not UTF-8 (JSON spells each byte six
characters) made root's verify answer about 70 MB, and the daemon refused to send it: "the
answer would be ... bytes, more than 67108864", exit 2, every allocation unverified as far
as cron could tell. Now the answer carries the results that fit in 16 MiB, those with
damage first, says how many it left out, and the summary still counts every allocation.
"""
from __future__ import annotations

import json
import os

import pytest

from daemon.server.verify import VERIFY_ANSWER_BYTES
from gpumemctl import Client
from tests.longnames import CHAIN, leaf
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

COUNT = 2_800                                       # x ~24.5 KB of JSON: past 64 MiB


def _fill(sock: str) -> int:
    with Client(sock, timeout=120) as c:
        c.mkdir(CHAIN, parents=True)
        for i in range(COUNT):
            c.create(f"{CHAIN}/{leaf(i)}", 1, ecc="none")
    return COUNT


def test_many_long_names_do_not_stop_roots_verify_all(daemon_factory):
    d = daemon_factory(extra_args=["--host-capacity", "8G", "--enable-fault-injection"])
    d.allow_errors = True                   # the damage below is logged at ERROR, on purpose
    run_as(_fill, d.socket, timeout=300)
    d.cli("mkdir", "root", check=True)
    d.cli("create", "root/damaged", "--size", "1M", check=True)
    d.cli("debug", "corrupt", "root/damaged", "--offset", "0", "--length", "1M", check=True)
    proc = d.cli("verify", "--all", "--json")
    assert proc.returncode == 8, proc.stderr          # damage left: verify's own code
    answer = json.loads(proc.stdout)
    assert answer["summary"]["allocations"] == COUNT + 1
    assert answer["complete"] is False and answer["left_out"] > 0
    assert len(answer["allocations"]) + answer["left_out"] == COUNT + 1
    shown = answer["allocations"]
    assert "root/damaged" in [r["path"] for r in shown]          # damage is listed first
    assert len(proc.stdout) < VERIFY_ANSWER_BYTES + (1 << 20)
    human = d.cli("verify", "--all")
    assert human.returncode == 8
    assert b"not listed" in human.stderr and b"root/damaged" in human.stdout
