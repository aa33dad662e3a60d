"""Scrub control and the recovery of others' allocations are the administrator's (issue 14):
before, any user could start a scrub at 1 byte/s (so root's cron `scrub --wait` failed
"already running"), stop root's scrub, or run `recover` on root's 0600 allocation. Now:
root, the daemon's own uid, or a member of the configured `admin_group`; everyone else gets
exit 6. Anyone may see `scrub status` and recover their own allocations."""
from __future__ import annotations

import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
PERMISSION = 6
ADMINS = 4242                 # a gid for admin_group


def attempt(fn, *args, **kw) -> dict:
    try:
        return {"value": fn(*args, **kw)}
    except GpumemError as exc:
        return {"error": type(exc).__name__, "code": exc.code, "message": str(exc)}


def _as_nobody(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {
        "start": attempt(c.scrub, "start", rate=1),
        "stop": attempt(c.scrub, "stop"),
        "status": attempt(c.scrub, "status"),
        "recover_roots": attempt(c.recover, "kept"),
    }
    c.create("mine", 1 << 20)
    res["recover_own"] = attempt(c.recover, "mine")
    c.close()
    return res


def _as_admin(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {"start": attempt(c.scrub, "start"), "recover_roots": attempt(c.recover, "kept")}
    c.close()
    return res


def daemon_with(daemon_factory, tmp_path, text: str = ""):
    path = tmp_path / "gpumemd.toml"
    path.write_text(text)
    return daemon_factory(extra_args=["--config", str(path)])


def test_scrub_control_and_recovering_others_are_for_the_administrator(daemon_factory,
                                                                       tmp_path):
    d = daemon_with(daemon_factory, tmp_path)
    d.cli("create", "kept", "--size", "1M", "--durable", check=True)     # root's, 0600
    res = run_as(_as_nobody, d.socket)
    for what in ("start", "stop", "recover_roots"):
        assert res[what].get("code") == PERMISSION, (what, res[what])
    assert "scrub" in res["start"]["message"] and "admin_group" in res["start"]["message"]
    assert "value" in res["status"], res["status"]          # status is open to all
    assert "value" in res["recover_own"], res["recover_own"]
    # Nothing was started in root's way: root's cron scrub runs and ends clean.
    assert d.cli("scrub", "--wait", "--quiet").returncode == 0


def test_a_member_of_admin_group_may_control_the_scrub(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, f"admin_group = {ADMINS}\n")
    d.cli("create", "kept", "--size", "1M", check=True)
    res = run_as(_as_admin, d.socket, groups=[ADMINS])
    assert "value" in res["start"], res["start"]
    assert "value" in res["recover_roots"], res["recover_roots"]
    res = run_as(_as_admin, d.socket)                       # the same uid, not in the group
    assert res["start"].get("code") == PERMISSION, res["start"]
