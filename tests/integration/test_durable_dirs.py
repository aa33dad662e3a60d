"""A directory's durable default through the socket API and the CLI (issue 27, item 3): op
`durable` on a directory (`gpumemctl durable DIR` / `transient DIR`) sets it, `info` and
`ls --json` show it as the directory's `durable`, and every create in it (create,
create_many, mkdir, a create's missing parents) is durable, across a kill -9 and restart of
the daemon with its real keeper. Another uid may neither set nor clear it on root's directory
(exit 6). The mount's side: tests/mount/test_durable_dirs.py."""
from __future__ import annotations

import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import NOBODY, run_as

MiB = 1 << 20
KiB = 1 << 10


def test_durable_on_a_directory_makes_what_is_created_in_it_durable(daemon):
    daemon.cli("mkdir", "models", check=True)
    daemon.cli("mkdir", "scratch", check=True)
    daemon.cli("create", "models/old", "--size", "1M", check=True)
    daemon.cli("durable", "models", check=True)                 # exit 0, not "not supported"
    assert daemon.cli_json("info", "models")["durable"] is True
    rows = {ln.split()[-1]: ln.split() for ln in
            daemon.cli("ls", "-l", check=True).stdout.decode().splitlines()[1:]}
    assert rows["models/"][5] == "durable" and rows["scratch/"][5] == "-", rows
    listed = {e["path"]: e for e in daemon.cli_json("ls")}
    assert listed["models"]["durable"] is True and listed["scratch"]["durable"] is False
    assert daemon.cli_json("info", "models/old")["durable"] is False    # not changed
    data = {name: os.urandom(size) for name, size in
            (("models/llama/weights", 3 * MiB), ("models/small", 10 * KiB))}
    for name, blob in data.items():
        daemon.cli("create", name, "--size", str(len(blob)), check=True)   # no --durable
        daemon.cli("write", name, input=blob, check=True)
        assert daemon.cli_json("info", name)["durable"] is True, name
    assert daemon.cli_json("info", "models/llama")["durable"] is True   # a parent made
    daemon.cli("mkdir", "models/sub", check=True)
    with daemon.client() as c:
        made = c.create_many([("models/sub/a", "8K"), ("models/sub/b", "2M"),
                              ("scratch/t", "8K")])
        assert [m["durable"] for m in made] == [True, True, False]
        c.write("models/sub/b", b"b" * 1000)
    daemon.cli("create", "scratch/gone", "--size", "1M", check=True)
    daemon.kill9()
    daemon.start()
    for name, blob in data.items():
        assert daemon.cli("read", name, check=True).stdout == blob, name
    with daemon.client() as c:
        assert c.read("models/sub/b", 0, 1000) == b"b" * 1000
        assert c.info("models/sub/a")["state"] == "ready"
        assert c.info("models")["durable"] and c.info("models/sub")["durable"]
    assert [e["path"] for e in daemon.cli_json("ls", "scratch")] == []
    daemon.cli("transient", "models", check=True)
    assert daemon.cli_json("info", "models")["durable"] is False
    daemon.cli("create", "models/after", "--size", "1M", check=True)
    assert daemon.cli_json("info", "models/after")["durable"] is False


def _try_default(sock: str) -> dict:
    c = Client(sock, timeout=20)
    out = {}
    for name, value in (("set", True), ("clear", False)):
        try:
            c.set_durable("shared", value)
            out[name] = "ok"
        except GpumemError as exc:
            out[name] = exc.code
    out["create"] = c.create("shared/mine", 4096)["durable"]
    c.close()
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_another_uid_may_not_change_roots_default(daemon):
    daemon.cli("mkdir", "shared", "--mode", "0777", check=True)
    daemon.cli("durable", "shared", check=True)
    got = run_as(_try_default, daemon.socket)
    assert got == {"set": 6, "clear": 6, "create": True}
    info = daemon.cli_json("info", "shared/mine")
    assert (info["uid"], info["durable"]) == (NOBODY, True)
    assert daemon.cli_json("info", "shared")["durable"] is True
