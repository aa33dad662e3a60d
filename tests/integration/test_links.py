"""Symbolic links through the socket API and the CLI (issue 15): `ln -s`, `ls -l` and
`--json`, which commands follow a link (docs/protocol.md, "Symbolic links"), loops, and
search permission through a link."""
from __future__ import annotations

import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.sizes import MiB
from tests.users import run_as


def test_ln_s_then_ls_info_read_write_and_rm(daemon):
    daemon.cli("create", "models/v2", "--size", "1M", check=True)
    daemon.cli("ln", "-s", "v2", "models/current", check=True)
    long = daemon.cli("ls", "-l", "models", check=True).stdout.decode()
    line = next(x for x in long.splitlines() if "current" in x)
    assert line.startswith("lrwxrwxrwx") and line.endswith("models/current -> v2"), line
    entries = {e["name"]: e for e in daemon.cli_json("ls", "models")}
    assert (entries["current"]["type"], entries["current"]["target"]) == ("symlink", "v2")
    shown = daemon.cli_json("ls", "models/current")        # ls shows the link itself
    assert [(e["type"], e["target"]) for e in shown] == [("symlink", "v2")]
    info = daemon.cli_json("info", "models/current")        # info follows, as stat(1)
    assert (info["type"], info["path"], info["size"]) == ("allocation", "models/v2", MiB)
    daemon.cli("write", "models/current", input=b"through the link", check=True)
    assert daemon.cli("read", "models/v2", "--length", "16", check=True).stdout == \
        b"through the link"
    with Client(daemon.socket) as c:
        assert c.readlink("models/current") == "v2"
        assert c.call("readlink", path="models/current")["info"]["type"] == "symlink"
        with pytest.raises(GpumemError, match="not a symbolic link"):
            c.readlink("models/v2")
        c.symlink("..", "models/up")                        # a link to a directory ...
        assert {e["name"] for e in c.ls("models/up/models")} == {"current", "up", "v2"}
        c.create("models/up/models/made", 4096)             # ... is a way into it
        assert c.info("models/made")["size"] == 4096
    daemon.cli("rm", "models/current", check=True)          # the link goes, not v2
    assert daemon.cli_json("info", "models/v2")["size"] == MiB
    daemon.cli("info", "models/current", check=4)
    assert daemon.cli_json("ln", "models/v2", "hard")["links"] == 2   # ln without -s: a
    daemon.cli("rm", "hard", check=True)                                # hard link (issue 15)
    daemon.cli("ln", "-s", "v2", "models/v2", check=5)      # the name is taken
    daemon.cli("check", check=True)


def test_loops_dangling_and_absolute_targets_are_clear_errors(daemon):
    """A loop is a usage error (exit 2, ELOOP); a dangling link is not found (4); an
    absolute target with no mount point to resolve it under is refused (2, EXDEV)."""
    daemon.cli("ln", "-s", "b", "a", check=True)
    daemon.cli("ln", "-s", "a", "b", check=True)
    err = daemon.cli("info", "a", check=2).stderr.decode()
    assert "too many levels of symbolic links" in err and err.count("\n") == 1, err
    daemon.cli("read", "a/x", check=2)
    daemon.cli("ln", "-s", "nowhere", "dangling", check=True)
    assert "dangling" in daemon.cli("info", "dangling", check=4).stderr.decode()
    daemon.cli("ln", "-s", "/etc/passwd", "abs", check=True)
    assert "outside the namespace" in daemon.cli("info", "abs", check=2).stderr.decode()
    daemon.cli("ln", "-s", "..", "above", check=True)
    daemon.cli("ls", "above/x", check=2)
    with Client(daemon.socket) as c:
        with pytest.raises(GpumemError, match="cannot be empty"):
            c.symlink("", "empty")
        with pytest.raises(GpumemError, match="at most 4095"):
            c.symlink("x" * 4096, "long")
        c.symlink("y" * 4095, "longest")
        chain = ["c0"]
        c.create("c0", 4096)
        for i in range(1, 42):                # c41 -> c40 -> ... -> c0: 41 links
            c.symlink(f"c{i - 1}", f"c{i}")
            chain.append(f"c{i}")
        assert c.info("c40")["path"] == "c0"  # 40 hops: Linux's limit, still followed
        with pytest.raises(GpumemError, match="too many levels"):
            c.info("c41")
    for name in ("a", "b", "dangling", "abs", "above", "longest", *chain):
        daemon.cli("rm", name, check=True)
    assert daemon.cli_json("ls") == []
    daemon.cli("check", check=True)


def _as_nobody(sock: str) -> dict:
    out = {}
    with Client(sock) as c:
        for what, fn in (("info root-link", lambda: c.info("root-link")),
                         ("ln into secret", lambda: c.symlink("secret", "mine")),
                         ("info mine/plans", lambda: c.info("mine/plans")),
                         ("read mine/plans", lambda: c.read("mine/plans")),
                         ("rm root-link", lambda: c.remove("root-link")),
                         ("rm mine", lambda: c.remove("mine"))):
            try:
                value = fn()
                out[what] = "ok" if not isinstance(value, dict) else value.get("type", "ok")
            except GpumemError as exc:
                out[what] = exc.code
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_a_link_does_not_bypass_search_permission(daemon):
    """Root's private directory stays closed to a user who reaches it through a link (root's
    or one of their own), and in the sticky root only a link's owner removes it."""
    daemon.cli("mkdir", "--mode", "0700", "secret", check=True)
    daemon.cli("create", "secret/plans", "--size", "4K", "--mode", "0644", check=True)
    daemon.cli("ln", "-s", "secret/plans", "root-link", check=True)
    assert run_as(_as_nobody, daemon.socket) == {
        "info root-link": 6, "ln into secret": "symlink", "info mine/plans": 6,
        "read mine/plans": 6, "rm root-link": 6, "rm mine": "ok"}
    assert daemon.cli_json("info", "root-link")["path"] == "secret/plans"
    daemon.cli("check", check=True)
