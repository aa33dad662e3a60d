"""Rename and resize from the CLI and Client (issue 27, item 2): `gpumemctl mv SRC DST`
(into a directory as mv does, -n), `gpumemctl resize NAME --size S`, `write --grow`, and a
write past the end that names the command that makes room. Another uid gets the checks
rename(2) and truncate(2) make; the mount sees a rename made through the socket."""
from __future__ import annotations

import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

MiB = 1 << 20
EXISTS, PERMISSION, BUSY = 5, 6, 9


def _write(d, name: str, data: bytes) -> None:
    d.cli("write", name, "-", input=data, check=True)


def test_mv_renames_moves_into_a_directory_and_keeps_the_bytes(daemon):
    data = os.urandom(MiB)
    daemon.cli("create", "a", "--size", "1M", check=True)
    _write(daemon, "a", data)
    daemon.cli("mv", "a", "b", check=True)
    daemon.cli("info", "a", check=4)
    assert daemon.cli("read", "b", check=True).stdout == data
    daemon.cli("mkdir", "d", check=True)
    moved = daemon.cli_json("mv", "b", "d")            # an existing directory: into it
    assert moved["path"] == "d/b"
    assert daemon.cli("read", "d/b", check=True).stdout == data
    kinds = [(e["kind"], e["detail"].get("from"), e["detail"].get("to"))
             for e in daemon.cli_json("events") if e["kind"] == "rename"]
    assert kinds == [("rename", "a", "b"), ("rename", "b", "d/b")]


def test_mv_replaces_unless_no_clobber(daemon):
    for name, byte in (("x", b"x"), ("y", b"y")):
        daemon.cli("create", name, "--size", "4K", check=True)
        _write(daemon, name, byte * 4096)
    err = daemon.cli("mv", "-n", "x", "y", check=EXISTS).stderr.decode()
    assert "exists" in err
    assert daemon.cli("read", "y", check=True).stdout == b"y" * 4096
    daemon.cli("mv", "x", "y", check=True)             # replaced, as rename(2) does
    assert daemon.cli("read", "y", check=True).stdout == b"x" * 4096
    assert [e["path"] for e in daemon.cli_json("ls")] == ["y"]


def test_resize_grows_with_zeros_and_shrinks(daemon):
    data = os.urandom(MiB)
    daemon.cli("create", "r", "--size", "1M", "--durable", check=True)
    _write(daemon, "r", data)
    grown = daemon.cli_json("resize", "r", "--size", "3M")
    assert grown["size"] == 3 * MiB
    assert daemon.cli("read", "r", check=True).stdout == data + bytes(2 * MiB)
    daemon.cli("resize", "r", "--size", "512K", check=True)
    assert daemon.cli("read", "r", check=True).stdout == data[:MiB // 2]
    daemon.cli("verify", "r", check=0)
    daemon.kill9()
    daemon.start()
    assert daemon.cli("read", "r", check=True).stdout == data[:MiB // 2]
    err = daemon.cli("resize", "r", check=2).stderr.decode()
    assert "--size" in err


def test_resize_of_a_held_allocation_is_busy(daemon):
    daemon.cli("create", "h", "--size", "1M", check=True)
    with Client(daemon.socket) as c, c.open("h", "r"):
        err = daemon.cli("resize", "h", "--size", "2M", check=BUSY).stderr.decode()
        assert "h" in err
    daemon.cli("resize", "h", "--size", "2M", check=True)


def test_a_write_past_the_end_names_the_fix_and_grow_makes_room(daemon, tmp_path):
    daemon.cli("create", "w", "--size", "1M", check=True)
    src = tmp_path / "big"
    payload = os.urandom(3 * MiB)
    src.write_bytes(payload)
    err = daemon.cli("write", "w", str(src), check=2).stderr.decode()
    assert f"gpumemctl resize w --size {3 * MiB}" in err and "--grow" in err, err
    assert "+-" not in err
    daemon.cli("write", "--grow", "w", str(src), check=True)
    assert daemon.cli("read", "w", check=True).stdout == payload
    # From a pipe: read to its end first, then written whole.
    more = os.urandom(MiB + 17)
    daemon.cli("write", "--grow", "--offset", "3M", "w", "-", input=more, check=True)
    assert daemon.cli("read", "w", check=True).stdout == payload + more
    # An offset past the end is said so, without a negative length.
    err = daemon.cli("read", "w", "--offset", "10G", "--length", "5", check=2).stderr.decode()
    assert "outside its size" in err and "-" not in err.split("offset")[1].split(":")[0]


def _as_other(sock: str) -> dict:
    c = Client(sock, timeout=30)
    out = {}
    for op, call in (("rename", lambda: c.rename("pub/root-file", "pub/mine")),
                     ("resize", lambda: c.resize("pub/root-file", 1)),
                     ("rename_sticky", lambda: c.rename("tmp/root-file", "tmp/taken")),
                     ("own_in_sticky", lambda: c.rename("tmp/nobody-file", "tmp/renamed"))):
        try:
            call()
            out[op] = "ok"
        except GpumemError as exc:
            out[op] = exc.code
    c.close()
    return out


def test_another_uid_gets_the_checks_rename_and_truncate_make(daemon):
    if os.geteuid() != 0:
        pytest.skip("switching uid needs root")
    daemon.cli("mkdir", "pub", check=True)             # 0755: others may not write it
    daemon.cli("create", "pub/root-file", "--size", "4K", "--mode", "0666", check=True)
    daemon.cli("mkdir", "tmp", "--mode", "1777", check=True)     # sticky, as /tmp
    daemon.cli("create", "tmp/root-file", "--size", "4K", "--mode", "0666", check=True)
    run_as(_create_own, daemon.socket)
    got = run_as(_as_other, daemon.socket)
    # pub is not writable by uid 65534: no rename out of it; the file is writable (0666):
    # resize is allowed, as truncate(2) of a file one may write.
    assert got["rename"] == PERMISSION
    assert got["resize"] == "ok"
    assert got["rename_sticky"] == PERMISSION          # sticky: not another's file
    assert got["own_in_sticky"] == "ok"
    names = {e["path"] for e in daemon.cli_json("ls", "-R")}
    assert {"pub/root-file", "tmp/root-file", "tmp/renamed"} <= names
    assert daemon.cli_json("info", "pub/root-file")["size"] == 1


def _create_own(sock: str) -> bool:
    with Client(sock, timeout=30) as c:
        c.create("tmp/nobody-file", 4096)
    return True


def test_the_mount_sees_a_rename_made_through_the_socket(mounted):
    d = mounted
    with open(os.path.join(d.mnt, "old"), "wb") as f:
        f.write(b"hello")
    assert os.listdir(d.mnt) == ["old"]
    d.cli("mv", "old", "new", check=True)
    assert os.listdir(d.mnt) == ["new"]
    assert not os.path.exists(os.path.join(d.mnt, "old"))
    with open(os.path.join(d.mnt, "new"), "rb") as f:
        assert f.read() == b"hello"
    d.cli("resize", "new", "--size", "8", check=True)
    assert os.path.getsize(os.path.join(d.mnt, "new")) == 8


def _plant_link(sock: str) -> bool:
    with Client(sock, timeout=30) as c:
        c.symlink("../secret", "tmp/link")       # a link to root's file, in a shared directory
    return True


def test_root_moving_a_link_another_user_planted_moves_the_link_not_its_target(daemon):
    if os.geteuid() != 0:
        pytest.skip("switching uid needs root")
    daemon.cli("mkdir", "tmp", "--mode", "1777", check=True)
    daemon.cli("create", "secret", "--size", "4K", check=True)
    _write(daemon, "secret", b"s" * 4096)
    run_as(_plant_link, daemon.socket)
    daemon.cli("mv", "tmp/link", "tmp/moved", check=True)
    assert daemon.cli("read", "secret", check=True).stdout == b"s" * 4096
    names = {e["path"]: e for e in daemon.cli_json("ls", "-R")}
    assert "secret" in names and names["tmp/moved"]["type"] == "symlink"
    assert "tmp/link" not in names
    daemon.cli("resize", "tmp/moved", "--size", "1", check=True)   # the target, followed...
    assert daemon.cli_json("info", "secret")["size"] == 1           # ...as truncate(1) does
