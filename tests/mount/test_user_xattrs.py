"""user.KEY extended attributes on the mount (issue 17): the node's user metadata, the same
that `gpumemctl meta` and the socket serve (daemon/fs/xattrs.py has the table). Alongside ours,
user.gpu.*, which keep their meanings (test_xattrs.py)."""
from __future__ import annotations

import errno
import json
import os

import pytest

from tests.users import run_as

from .posix import expect_errno

OURS = {f"user.gpu.{n}" for n in
        ("size", "durable", "capacity", "device", "state", "refcount", "ecc", "id")}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def touch(path: str, mode: int = 0o644) -> str:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))
    os.chmod(path, mode)
    return path


def test_set_get_list_remove_and_the_flags(mounted):
    f = touch(os.path.join(mounted.mnt, "f"))
    os.setxattr(f, "user.foo", b"bar")
    assert os.getxattr(f, "user.foo") == b"bar"
    os.setxattr(f, "user.empty", b"")
    os.setxattr(f, "user.bin", b"\x00\xff\n")
    assert os.getxattr(f, "user.bin") == b"\x00\xff\n"
    names = os.listxattr(f)
    assert names == ["user.bin", "user.empty", "user.foo"]      # the user's, never ours
    assert all(os.getxattr(f, n) is not None for n in OURS)     # ours: by name only
    # XATTR_CREATE and XATTR_REPLACE
    expect_errno(errno.EEXIST, os.setxattr, f, "user.foo", b"x", os.XATTR_CREATE)
    expect_errno(errno.ENODATA, os.setxattr, f, "user.new", b"x", os.XATTR_REPLACE)
    os.setxattr(f, "user.foo", b"baz", os.XATTR_REPLACE)
    os.setxattr(f, "user.new", b"x", os.XATTR_CREATE)
    assert os.getxattr(f, "user.foo") == b"baz" and os.getxattr(f, "user.new") == b"x"
    # the same metadata through the socket, and back
    assert mounted.cli("meta", "get", "f", "foo", check=True).stdout == b"baz\n"
    assert mounted.cli_json("meta", "ls", "f")["metadata"] == {
        "bin": "\x00\udcff\n", "empty": "", "foo": "baz", "new": "x"}
    mounted.cli("meta", "set", "f", "from-cli", "hello", check=True)
    assert os.getxattr(f, "user.from-cli") == b"hello"
    os.removexattr(f, "user.foo")
    expect_errno(errno.ENODATA, os.getxattr, f, "user.foo")
    expect_errno(errno.ENODATA, os.removexattr, f, "user.foo")
    mounted.cli("meta", "get", "f", "foo", check=4)
    # other namespaces keep their answers; user.gpu.* stays ours
    expect_errno(errno.ENODATA, os.getxattr, f, "security.capability")
    expect_errno(errno.ENOTSUP, os.setxattr, f, "security.test", b"1")
    expect_errno(errno.ENOTSUP, os.setxattr, f, "trusted.test", b"1")
    expect_errno(errno.ENOTSUP, os.setxattr, f, "user.gpu.nothing", b"1")
    assert os.getxattr(f, "user.gpu.state") == b"pending"
    # a directory carries them too; the .metadata mirror shows them as info does
    d = os.path.join(mounted.mnt, "d")
    os.mkdir(d)
    os.setxattr(d, "user.team", b"infra")
    assert os.listxattr(d) == ["user.team"]
    assert mounted.cli_json("info", "d")["metadata"] == {"team": "infra"}
    with open(os.path.join(mounted.mnt, ".metadata", "f")) as mirror:
        shown = json.load(mirror)
    assert shown["metadata"] == {"bin": "\x00\udcff\n", "empty": "", "from-cli": "hello",
                                 "new": "x"}
    # a hard link is one node: its attributes are the same
    os.link(f, os.path.join(mounted.mnt, "g"))
    assert os.getxattr(os.path.join(mounted.mnt, "g"), "user.new") == b"x"


def test_links_and_special_files_refuse_and_bounds_are_errnos(mounted_factory, tmp_path):
    path = tmp_path / "gpumemd.toml"
    path.write_text('metadata_max_bytes = "100K"\n')
    mounted = mounted_factory(extra_args=["--config", str(path)])
    mnt = mounted.mnt
    f = touch(os.path.join(mnt, "f"))
    link = os.path.join(mnt, "link")
    os.symlink("f", link)
    expect_errno(errno.EPERM, os.setxattr, link, "user.k", b"v", follow_symlinks=False)
    expect_errno(errno.ENODATA, os.getxattr, link, "user.k", follow_symlinks=False)
    os.setxattr(link, "user.k", b"v")                    # followed: the file's
    assert os.getxattr(f, "user.k") == b"v"
    fifo = os.path.join(mnt, "fifo")
    os.mkfifo(fifo)
    expect_errno(errno.EPERM, os.setxattr, fifo, "user.k", b"v")
    mounted.cli("meta", "set", "fifo", "k", "v", check=2)
    # a value past the kernel's 64 KiB: E2BIG, whichever way it came
    expect_errno(errno.E2BIG, os.setxattr, f, "user.big", bytes(65537))
    mounted.cli("meta", "set", "f", "big", "-", input=b"x" * 70_000, check=True)
    expect_errno(errno.E2BIG, os.getxattr, f, "user.big")
    assert mounted.client().meta_get("f", "big") == "x" * 70_000
    # the per-node bound (100K here): ENOSPC; nothing of the refused value is kept
    os.setxattr(f, "user.more", bytes(30_000))
    expect_errno(errno.ENOSPC, os.setxattr, f, "user.most", bytes(60_000))
    expect_errno(errno.ENODATA, os.getxattr, f, "user.most")
    os.removexattr(f, "user.big")
    os.setxattr(f, "user.most", bytes(60_000))
    assert len(os.getxattr(f, "user.most")) == 60_000


@needs_root
def test_another_uid_gets_what_linux_would_give(mounted):
    mnt = mounted.mnt
    shared, private = touch(os.path.join(mnt, "shared"), 0o644), \
        touch(os.path.join(mnt, "private"), 0o600)
    os.setxattr(shared, "user.k", b"shared value")
    os.setxattr(private, "user.k", b"private value")
    os.mkdir(os.path.join(mnt, "tmp"), 0o1777)
    os.chmod(os.path.join(mnt, "tmp"), 0o1777)

    def outcome(fn, *args):
        try:
            value = fn(*args)
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return value.decode() if isinstance(value, bytes) else value

    def as_nobody():
        mine = touch(os.path.join(mnt, "tmp", "mine"))
        return {
            "get shared": outcome(os.getxattr, shared, "user.k"),
            "set shared": outcome(os.setxattr, shared, "user.k", b"nobody"),
            "remove shared": outcome(os.removexattr, shared, "user.k"),
            "get private": outcome(os.getxattr, private, "user.k"),
            "list private": outcome(os.listxattr, private),
            "set sticky dir": outcome(os.setxattr, os.path.join(mnt, "tmp"), "user.k", b"v"),
            "set own": outcome(os.setxattr, mine, "user.k", b"mine"),
            "get own": outcome(os.getxattr, mine, "user.k"),
        }

    got = run_as(as_nobody)
    # listxattr needs no read permission on Linux: it gives names, never values
    assert got.pop("list private") == ["user.k"]           # ours are never listed
    assert got == {
        "get shared": "shared value", "set shared": "EACCES", "remove shared": "EACCES",
        "get private": "EACCES", "set sticky dir": "EPERM", "set own": None,
        "get own": "mine"}
    assert os.getxattr(shared, "user.k") == b"shared value"
    assert mounted.cli_json("meta", "get", "tmp/mine", "k")["value"] == "mine"
