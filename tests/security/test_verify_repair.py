"""`verify --repair` writes only what the caller may repair (issue 14, lower items).

Before: verify needs read permission only, and with --repair it also repaired, that is
wrote, another user's allocation that the caller could only read. Now --repair repairs
the caller's own allocations (the administrator's: any, as for `recover`); the others in
the set are verified as without --repair, their result says `"repair": "not permitted"`,
and damage left in them makes the exit 8, as a verify without --repair would."""
from __future__ import annotations

import json
import mmap  # noqa: F401 - Client.write maps memory; nothing is imported after the uid drop
import os

import pytest

from gpumemctl import Client
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
REPAIRED, UNCORRECTABLE = 1, 8
MiB = 1 << 20


def _make_mine(sock: str, data: bytes) -> None:
    c = Client(sock, timeout=30)
    c.create("mine", len(data), mode=0o644)
    c.write("mine", data)
    c.close()


def _verify_with_repair(sock: str) -> dict:
    c = Client(sock, timeout=30)
    try:
        return c.verify(["roots", "mine"], repair=True)
    finally:
        c.close()


def corrupt(d, name: str) -> None:
    d.cli("debug", "corrupt", name, "--offset", "1000", "--length", "3", check=True)


def test_repair_by_a_reader_leaves_the_owners_allocation_alone(ecc_daemon):
    d = ecc_daemon
    d.cli("create", "roots", "--size", "1M", "--mode", "0644", check=True)   # nobody reads it
    d.cli("write", "roots", "-", input=os.urandom(MiB), check=True)
    run_as(_make_mine, d.socket, os.urandom(MiB))            # nobody's own
    corrupt(d, "roots")
    corrupt(d, "mine")

    result = run_as(_verify_with_repair, d.socket)
    by_path = {r["path"]: r for r in result["allocations"]}
    assert by_path["roots"]["repair"] == "not permitted", by_path["roots"]
    assert by_path["roots"]["damaged"] and by_path["roots"]["corrected"] == 0
    assert "repair" not in by_path["mine"] and by_path["mine"]["corrected"] > 0
    assert result["summary"]["exit"] == UNCORRECTABLE          # damage left in roots

    # root's allocation was not written: the damage is still there, for root to repair.
    still = json.loads(d.cli("verify", "roots", "--json", check=UNCORRECTABLE).stdout)
    assert still["allocations"][0]["damaged"]
    human = d.cli("verify", "roots", "mine", "--repair", check=REPAIRED).stdout.decode()
    assert "roots:" in human and "repaired" in human
    assert d.cli_json("check")["clean"] is True
