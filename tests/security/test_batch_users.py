"""The batch ops as another uid (issue 26; docs/security.md): a user who puts other users'
names among its own in `create_many`, `read_many`, `write_many` and `remove_many` gets a
permission error (code 6) for each item it may not touch, exactly where the single op would
refuse it, while its own items succeed; nothing of root's changes, and a name inside a
directory it may not search is refused the same whether it exists or not.

Runs as root: the test forks a child that drops to uid 65534 (tests/users.py run_as), which
must have imported everything it uses already (base64 below, for the client library)."""
from __future__ import annotations

import base64  # noqa: F401  imported before the fork: the child may import nothing
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

SECRET = b"root's bytes " * 100
PUBLIC = b"anyone may read this " * 50


def outcome(results: list) -> list:
    """Each item's result as JSON: "ok" (with bytes or a count) or the error's code."""
    out = []
    for r in results:
        if isinstance(r, GpumemError):
            out.append(r.code)
        elif isinstance(r, bytes):
            out.append(["ok", r.hex()])
        else:
            out.append("ok")
    return out


def _as_nobody(sock: str) -> dict:
    c = Client(sock, timeout=60)
    res = {
        "create": outcome(c.create_many([
            ("mine/a", 4096), ("mine/b", 4096),
            ("shared/intruder", 4096),           # root's directory, 0755: no write
            ("private/intruder", 4096),          # root's directory, 0700: no search
            ("mine/c", 4096)], mode=0o644)),
        "write": outcome(c.write_many([
            ("mine/a", b"nobody's own"),
            ("shared/readable", b"overwritten!"),     # 0644: read, not write
            ("secret", b"overwritten!"),              # 0600 root's: neither
            ("shared/open", b"written by nobody"),    # 0666: both
            ("private/exists", b"x"), ("private/missing", b"x")])),
        "read": outcome(c.read_many([
            ("mine/a", 0, 12), ("secret", 0, 8), ("shared/readable", 0, 6),
            ("private/exists", 0, 1), ("private/missing", 0, 1), ("shared/open", 0, 17)])),
        "remove": outcome(c.remove_many([
            "mine/b", "secret",                  # the sticky root: root's entry
            "shared/readable",                   # a directory nobody may not write
            "private/exists", "private/missing", "mine/c"])),
    }
    c.close()
    return res


def test_another_uid_gets_a_permission_error_per_item_and_its_own_succeed(daemon):
    with daemon.client() as c:
        c.mkdir("shared", mode=0o755)
        c.mkdir("private", mode=0o700)
        c.create("secret", len(SECRET), mode=0o600)
        c.write("secret", SECRET)
        c.create("shared/readable", len(PUBLIC), mode=0o644)
        c.write("shared/readable", PUBLIC)
        c.create("shared/open", 64, mode=0o666)
        c.create("private/exists", 4096, mode=0o666)
    res = run_as(_as_nobody, daemon.socket)
    assert res["create"] == ["ok", "ok", 6, 6, "ok"]
    assert res["write"] == ["ok", 6, 6, "ok", 6, 6]
    assert res["read"] == [["ok", b"nobody's own".hex()], 6, ["ok", PUBLIC[:6].hex()], 6, 6,
                           ["ok", b"written by nobody".hex()]]
    assert res["remove"] == ["ok", 6, 6, 6, 6, "ok"]
    with daemon.client() as c:                      # root's are as they were
        assert c.read("secret") == SECRET and c.read("shared/readable") == PUBLIC
        assert c.read("private/exists") == bytes(4096)
        names = {e["path"]: e for e in c.ls(recursive=True)}
        assert {"mine/a", "secret", "shared/readable", "shared/open",
                "private/exists"} <= set(names)
        assert not {"mine/b", "mine/c", "shared/intruder", "private/intruder"} & set(names)
        assert names["mine/a"]["uid"] == NOBODY
        assert c.check()["clean"]
