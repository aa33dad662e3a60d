"""What one user can make the daemon store or log (issue 14): names, handles, its share of the
event log and of the daemon's log are bounded per uid; root is not. Before, a user could fill
the registry with names and handles, push every other user's history out of the event log,
and write one log line per event without end. Run as uid 65534 against a root daemon."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.open maps the memory; nothing is imported after the uid drop
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import HeldAs, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
NO_MEMORY, BUSY = 7, 9


def attempt(fn, *args, **kw) -> dict:
    try:
        fn(*args, **kw)
        return {"ok": True}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}


def daemon_with(daemon_factory, tmp_path, text: str):
    path = tmp_path / "gpumemd.toml"
    path.write_text(text)
    return daemon_factory(extra_args=["--config", str(path)])


def _make_names(sock: str, n: int) -> dict:
    c = Client(sock)
    c.mkdir("mine")
    made = [attempt(c.create, f"mine/a{i}", 4096) for i in range(n)]
    res = {"ok": sum(1 for m in made if m.get("ok")), "refused": made[-1]}
    c.remove("mine/a0")
    res["after_rm"] = attempt(c.create, "mine/again", 4096)
    c.close()
    return res


def test_names_per_uid_are_bounded(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, "max_names_per_uid = 20\n")
    res = run_as(_make_names, d.socket, 25)
    assert res["ok"] == 19                       # the directory is one of the 20
    assert res["refused"]["code"] == NO_MEMORY
    assert "uid 65534 has 20 names" in res["refused"]["message"]
    assert "max_names_per_uid 20" in res["refused"]["message"]
    assert res["after_rm"] == {"ok": True}
    for i in range(30):                          # root is not bound by it
        d.cli("create", f"r{i}", "--size", "4K", check=True)


def _open_many(sock: str, n: int):
    c = Client(sock)
    c.create("shared", 4096)
    handles, refused = [], None
    for _ in range(n):
        try:
            handles.append(c.open("shared", "r"))
        except GpumemError as exc:
            refused = {"code": exc.code, "message": str(exc)}
    handles.pop().close()
    again = attempt(c.open, "shared", "r")
    return {"held": len(handles), "refused": refused, "again": again}, [c, handles]


def test_handles_per_uid_are_bounded(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, "max_handles_per_uid = 10\n")
    with HeldAs(_open_many, d.socket, 15) as held:
        res = held.report
        assert res["held"] == 9 and res["again"] == {"ok": True}
        assert res["refused"]["code"] == BUSY
        assert "uid 65534 holds 10 handles" in res["refused"]["message"]
        c = d.client()
        c.create("roots", 4096)
        roots = [c.open("roots", "r") for _ in range(20)]    # root: no bound
        assert len(roots) == 20
        c.close()


LONG = "/".join(["n" * 200] * 4)


def _churn(sock: str, rounds: int) -> int:
    c = Client(sock)
    c.mkdir(LONG, parents=True)
    for i in range(rounds):
        c.create(f"{LONG}/f{i}", 4096)
        c.remove(f"{LONG}/f{i}")
    c.close()
    return rounds


def test_one_user_cannot_push_the_others_out_of_the_event_log(daemon_factory, tmp_path):
    d = daemon_with(daemon_factory, tmp_path, 'event_log_size = "64K"\n')
    d.cli("create", "roots-history", "--size", "4K", check=True)
    run_as(_churn, d.socket, 100)        # 200 events of ~820 bytes: 160 KB, past the 64K log
    events = d.client().events(limit=10_000)
    assert any(e["path"] == "roots-history" and e["kind"] == "create" for e in events)
    theirs = [e for e in events if e["uid"] == 65534]
    assert theirs and len(theirs) < 40              # their quarter of 64K, the newest
    assert theirs[-1]["path"] == f"{LONG}/f99"


def test_one_user_cannot_flood_the_daemon_log(daemon_factory, tmp_path):
    d = daemon_factory()
    run_as(_churn, d.socket, 300)                   # 600 events at once
    log = d.log()
    lines = [ln for ln in log.splitlines() if " event " in ln and "uid=65534" in ln]
    assert 200 <= len(lines) < 400, len(lines)
    assert "event lines of uid 65534 were not logged" in log or len(lines) < 600
    d.cli("create", "root-still-logged", "--size", "4K", check=True)
    assert "root-still-logged" in d.log()
