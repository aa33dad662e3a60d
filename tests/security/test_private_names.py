"""Names inside private directories (issue 14): `verify --all`, `verify DIR`, `scrub status`'s
per-allocation lines and `recover` walked everything with read permission on the allocation
only, never search permission on the directories above it: uid 65534 listed `secret/plan-X`
inside a 0700 directory. Every answer now follows the visibility rules of `ls`/`info`."""
from __future__ import annotations

import json
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
PERMISSION = 6


def attempt(fn, *args, **kw):
    try:
        return {"value": fn(*args, **kw)}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}


def _look(sock: str) -> dict:
    c = Client(sock, timeout=30)
    res = {
        "verify_all": attempt(c.verify, all=True),
        "verify_dir": attempt(c.verify, ["secret"]),
        "verify_top": attempt(c.verify, [""]),
        "recover": attempt(c.recover, "secret/plan-X"),
        "scrub": attempt(c.scrub, "status"),
    }
    c.close()
    return json.loads(json.dumps(res))


def test_names_in_private_directories_do_not_leak(daemon):
    d = daemon
    d.cli("mkdir", "secret", "--mode", "0700", check=True)
    d.cli("mkdir", "open", check=True)
    for name in ("secret/plan-X", "open/public"):
        d.cli("create", name, "--size", "1M", "--mode", "0644", check=True)
    d.cli("scrub", "--wait", check=True)        # a finished scrub with per-allocation lines
    assert "secret/plan-X" in json.dumps(d.client().scrub("status"))   # root sees all
    res = run_as(_look, d.socket)
    everything = json.dumps(res)
    assert "plan-X" not in everything, everything
    assert "open/public" in json.dumps(res["verify_all"])         # what ls -R shows stays
    assert "open/public" in json.dumps(res["verify_top"])
    assert "open/public" in json.dumps(res["scrub"])
    assert res["verify_dir"]["code"] == PERMISSION
    assert res["recover"]["code"] == PERMISSION
