"""Names that are not UTF-8 (issue 14, lower items).

Names are bytes on Linux and travel as str with surrogateescape (docs/protocol.md), so any
byte but NUL and `/` is allowed. Before: SQLite TEXT must be UTF-8, and a name holding byte
0xff reached the registry as a lone surrogate: `create` failed with exit 70 (internal
error), and the mount refused such names (EINVAL). Now the registry stores such a name as a
BLOB of its bytes (daemon/registry/, stored_name; schema 7), the mount takes and lists
them, and every verb works with them. A hostile user making such names breaks nothing of
root's: `ls`, `events`, `check`, `verify`, a restart that loads them back."""
from __future__ import annotations

import mmap  # noqa: F401 - Client.write maps memory; nothing is imported after the uid drop
import os
import sqlite3

import pytest

from daemon.registry import Registry
from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
USAGE, EXISTS = 2, 5
DIR = b"dir\xff".decode("utf-8", "surrogateescape")
NAME = DIR + "/" + b"\xfe\xffname".decode("utf-8", "surrogateescape")
LATIN = b"caf\xe9".decode("utf-8", "surrogateescape")         # Latin-1, not UTF-8
DATA = b"kept across a restart"


def attempt(fn, *args, **kw) -> dict:
    try:
        return {"value": fn(*args, **kw)}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}


def _as_nobody(sock: str) -> dict:
    c = Client(sock, timeout=20)
    c.create(NAME, 4096, durable=True, mode=0o644)
    c.write(NAME, DATA)
    c.create(LATIN, 4096, mode=0o644)
    res = {
        "read": c.read(NAME, length=len(DATA)).decode(),
        "info": c.info(NAME)["path"],
        "ls": sorted(e["path"] for e in c.ls("", recursive=True)),
        "events": [e["path"] for e in c.events(path=DIR)],
        "transient": attempt(c.set_durable, LATIN, False),
        "verify": attempt(c.verify, [NAME]),
        # "\udcc3\udca9" are the bytes of "é", escaped by a client: the same name as "é".
        "escaped_e": attempt(c.create, "\udcc3\udca9", 4096),
        "plain_e": attempt(c.create, "\xe9", 4096),
        # A surrogate that stands for no byte (JSON can carry it): no name at all.
        "lone": attempt(c.create, "x\ud800", 4096),
        "lone_ls": attempt(c.ls, "\ud800"),
    }
    c.close()
    return res


def test_names_that_are_not_utf8_work_through_the_socket(daemon):
    res = run_as(_as_nobody, daemon.socket)
    assert res["read"] == DATA.decode()
    assert res["info"] == NAME
    assert res["ls"] == sorted([DIR, NAME, LATIN])
    assert res["events"] and set(res["events"]) <= {DIR, NAME}
    assert "value" in res["transient"] and "value" in res["verify"], res
    assert "value" in res["escaped_e"], res["escaped_e"]
    assert res["plain_e"]["code"] == EXISTS, res["plain_e"]         # one spelling per name
    for what in ("lone", "lone_ls"):
        assert res[what]["code"] == USAGE, res[what]
        assert "surrogate" in res[what]["message"], res[what]

    # Root's views of what nobody made: clean exits, the bytes shown escaped.
    ls = daemon.cli("ls", "-R", check=True).stdout.decode()
    assert "dir\\xff/\\xfe\\xffname" in ls and "caf\\xe9" in ls and "\xe9" in ls
    assert {e["path"] for e in daemon.cli_json("ls", "-R")} == {DIR, NAME, LATIN, "\xe9"}
    assert daemon.cli_json("info", NAME)["path"] == NAME
    events = daemon.cli("events", check=True).stdout.decode()
    assert "dir\\xff/\\xfe\\xffname" in events
    assert {e["path"] for e in daemon.cli_json("events", "--path", DIR)} == {DIR, NAME}
    assert daemon.cli_json("check")["clean"] is True
    daemon.cli("verify", "--all", check=True)
    daemon.cli("durable", LATIN, check=True)

    # The registry loads them back: the durable ones keep their memory, under their names.
    daemon.restart()
    assert {e["path"] for e in daemon.cli_json("ls", "-R")} == {DIR, NAME, LATIN}
    assert daemon.cli("read", NAME, "--length", str(len(DATA)), check=True).stdout == DATA
    assert daemon.cli_json("check")["clean"] is True
    assert {e["path"] for e in daemon.cli_json("events", "--path", DIR)} == {DIR, NAME}
    daemon.cli("rm", "-r", DIR, LATIN, check=True)
    assert daemon.cli_json("ls", "-R") == []
    assert daemon.cli_json("check")["clean"] is True


def test_names_that_are_not_utf8_work_through_the_mount(mounted):
    mnt = os.fsencode(mounted.mnt)
    os.mkdir(mnt + b"/d\xff")
    fd = os.open(mnt + b"/d\xff/\xfe\xfe", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, DATA)
    os.close(fd)
    assert os.listdir(mnt) == [b"d\xff"]
    assert os.listdir(mnt + b"/d\xff") == [b"\xfe\xfe"]
    os.rename(mnt + b"/d\xff/\xfe\xfe", mnt + b"/d\xff/\xe9t\xe9")
    os.chmod(mnt + b"/d\xff/\xe9t\xe9", 0o600)
    os.setxattr(mnt + b"/d\xff/\xe9t\xe9", "user.gpu.durable", b"1")
    name = b"d\xff/\xe9t\xe9".decode("utf-8", "surrogateescape")
    info = mounted.cli_json("info", name)                     # the socket sees the same name
    assert (info["path"], info["mode"], info["durable"]) == (name, "0600", True)
    assert mounted.cli("read", name, check=True).stdout[:len(DATA)] == DATA
    assert any(e["kind"] == "rename" for e in mounted.cli_json("events", "--path", name))

    mounted.restart()
    assert os.listdir(mnt + b"/d\xff") == [b"\xe9t\xe9"]
    with open(mnt + b"/d\xff/\xe9t\xe9", "rb") as f:
        assert f.read(len(DATA)) == DATA
    assert mounted.cli_json("check")["clean"] is True
    os.unlink(mnt + b"/d\xff/\xe9t\xe9")
    os.rmdir(mnt + b"/d\xff")
    assert os.listdir(mnt) == []


def test_the_registry_keeps_one_stored_form_per_name(tmp_path):
    """UTF-8 names stay TEXT (as every older registry has them), others are BLOBs of their
    bytes, so UNIQUE (parent, name) holds across the two; the event log's path filter
    compares bytes, and finds both forms."""
    reg = Registry(str(tmp_path / "registry.sqlite"))
    common = dict(parent=1, kind="dir", uid=0, gid=0, mode=0o755, created_ns=0,
                  modified_ns=0, changed_ns=0)
    with reg.transaction(durable=False):
        reg.nodes.insert(name="plain", **common)
        reg.nodes.insert(name=LATIN, **common)
        reg.nodes.insert(name="\xe9", **common)
        reg.event_log.add("mkdir", 2, "plain/x", 0, 1, {}, 0)
        reg.event_log.add("mkdir", 3, LATIN + "/x", 0, 1, {"name": LATIN}, 0)
    stored = dict(reg.db.execute("SELECT name, typeof(name) FROM nodes WHERE id > 1"))
    assert stored == {"plain": "text", b"caf\xe9": "blob", "\xe9": "text"}
    for again in (LATIN, "\udcc3\udca9"):       # the second: the bytes of "\xe9", escaped
        with pytest.raises(sqlite3.IntegrityError), reg.transaction(durable=False):
            reg.nodes.insert(name=again, **common)
    assert [r["name"] for r in reg.nodes.load()] == ["", "plain", LATIN, "\xe9"]
    found = reg.event_log.query(path=LATIN)
    assert [(e["path"], e["detail"]) for e in found] == [(LATIN + "/x", {"name": LATIN})]
    assert [e["path"] for e in reg.event_log.query(path="plain")] == ["plain/x"]
    assert reg.event_log.size_bytes() == reg.db.execute(
        "SELECT SUM(length(CAST(detail AS BLOB)) + length(CAST(path AS BLOB))) FROM events"
    ).fetchone()[0]
    reg.close()
