"""Holding others hostage with memory (issue 14): with no quota configured one user could take
all device memory, and memory kept alive by an open holder after `rm --force` did not count
against its owner (a create-open-rm loop held 320 MiB with `used: 0`). Now `default_quota`
binds every uid that [quotas] does not name (root and the daemon's uid excepted), and memory a
removed allocation still holds counts against its owner until the last holder lets go.
Run as uid 65534 against a root daemon."""
from __future__ import annotations

import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import HeldAs, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
MiB = 1 << 20
NO_MEMORY = 7


def attempt(fn, *args, **kw) -> dict:
    try:
        fn(*args, **kw)
        return {"ok": True}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc), "details": exc.details}


def daemon_with(daemon_factory, tmp_path, text: str):
    path = tmp_path / "gpumemd.toml"
    path.write_text(text)
    return daemon_factory(extra_args=["--config", str(path)])


def _fill(sock: str) -> dict:
    c = Client(sock)
    res = {"first": attempt(c.create, "a", 48 * MiB), "past": attempt(c.create, "b", 32 * MiB),
           "quotas": c.status()["quotas"]}
    c.close()
    return res


def test_default_quota_binds_users_without_an_entry_but_not_root(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, 'default_quota = "64M"\n')
    res = run_as(_fill, d.socket)
    assert res["first"] == {"ok": True}
    assert res["past"]["code"] == NO_MEMORY
    assert "quota exceeded for uid 65534: 64 MiB quota, 48 MiB used" in res["past"]["message"]
    assert res["quotas"] == [{"uid": 65534, "quota": 64 * MiB, "used": 48 * MiB}]
    d.cli("create", "roots", "--size", "128M", check=True)        # root: no default quota
    quotas = d.client().status()["quotas"]
    assert quotas == [{"uid": 65534, "quota": 64 * MiB, "used": 48 * MiB}]


def test_an_entry_in_quotas_overrides_the_default(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path,
                    'default_quota = "16M"\n[quotas]\n65534 = "64M"\n')
    res = run_as(_fill, d.socket)
    assert res["first"] == {"ok": True} and res["past"]["code"] == NO_MEMORY


def _hold_removed(sock: str):
    """Create, open, and remove by force: the handle keeps the memory."""
    c = Client(sock)
    c.create("held", 48 * MiB)
    handle = c.open("held", "r")
    c.remove("held", force=True)
    return {"quotas": c.status()["quotas"]}, [c, handle]


def _create(sock: str, name: str) -> dict:
    c = Client(sock)
    res = attempt(c.create, name, 32 * MiB)
    res["quotas"] = c.status()["quotas"]
    c.close()
    return res


def test_memory_held_after_rm_force_counts_against_its_owner(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, '[quotas]\n65534 = "64M"\n')
    with HeldAs(_hold_removed, d.socket) as held:
        assert held.report["quotas"] == [{"uid": 65534, "quota": 64 * MiB, "used": 48 * MiB}]
        res = run_as(_create, d.socket, "next")
        assert res["code"] == NO_MEMORY, res                  # 48 held + 32 > 64
        assert res["details"]["used"] == 48 * MiB
    res = run_as(_create, d.socket, "next")                   # the holder is gone: freed
    assert res["ok"] is True
    assert res["quotas"] == [{"uid": 65534, "quota": 64 * MiB, "used": 32 * MiB}]
