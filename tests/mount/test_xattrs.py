"""The user.gpu.* extended attributes (daemon/fs/xattrs.py has the table)."""
from __future__ import annotations

import errno
import os

import pytest

from .posix import MiB, expect_errno

NAMES = {f"user.gpu.{n}" for n in
         ("size", "durable", "capacity", "device", "state", "refcount", "ecc", "id")}


def get(path: str, name: str) -> str:
    return os.getxattr(path, name).decode()


@pytest.mark.slabs_off
def test_size_allocates_then_resizes(mounted):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    assert (get(f, "user.gpu.state"), get(f, "user.gpu.size"),
            get(f, "user.gpu.capacity"), get(f, "user.gpu.device")) == ("pending", "0", "0", "")
    os.setxattr(f, "user.gpu.size", b"3M")             # units as the CLI accepts them
    assert (get(f, "user.gpu.state"), get(f, "user.gpu.size")) == ("ready", str(3 * MiB))
    assert get(f, "user.gpu.capacity") == str(4 * MiB)
    assert os.stat(f).st_size == 3 * MiB
    with open(f, "r+b") as fh:
        fh.write(b"keep")
    os.setxattr(f, "user.gpu.size", b"1048576\n")       # a shrink keeps the head
    assert os.stat(f).st_size == MiB and get(f, "user.gpu.capacity") == str(2 * MiB)
    with open(f, "rb") as fh:
        assert fh.read(4) == b"keep" and fh.read() == bytes(MiB - 4)
    assert get(f, "user.gpu.id") == str(os.stat(f).st_ino)
    assert os.listxattr(f) == []              # ours are read by name only (issue 27)
    assert {n: get(f, n) for n in NAMES}["user.gpu.size"] == str(MiB)
    assert mounted.cli_json("info", "f")["size"] == MiB


@pytest.mark.parametrize("word,durable", [("true", True), ("1", True), ("yes", True),
                                          ("YES", True), ("false", False), ("0", False),
                                          ("no", False)])
def test_durable_words(mounted, word, durable):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.setxattr(f, "user.gpu.size", b"1M")
    os.setxattr(f, "user.gpu.durable", b"false" if durable else b"true")
    os.setxattr(f, "user.gpu.durable", word.encode())
    assert get(f, "user.gpu.durable") == ("true" if durable else "false")
    assert mounted.cli_json("info", "f")["durable"] is durable
    assert get(f, "user.gpu.refcount") == ("1" if durable else "0")


@pytest.mark.parametrize("name,value", [
    ("user.gpu.size", b"abc"), ("user.gpu.size", b"-1"), ("user.gpu.size", b"1.5B"),
    ("user.gpu.size", b"1e99"), ("user.gpu.size", b"\xff"), ("user.gpu.durable", b"maybe"),
    ("user.gpu.durable", b""), ("user.gpu.durable", b"2")])
def test_bad_values_are_einval(mounted, name, value):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.setxattr(f, "user.gpu.size", b"1M")
    expect_errno(errno.EINVAL, os.setxattr, f, name, value)
    assert get(f, "user.gpu.size") == str(MiB) and get(f, "user.gpu.durable") == "false"


def test_read_only_unknown_and_remove(mounted):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.setxattr(f, "user.gpu.size", b"1M")
    for name in NAMES - {"user.gpu.size", "user.gpu.durable"}:
        expect_errno(errno.EPERM, os.setxattr, f, name, b"something-else")
        os.setxattr(f, name, os.getxattr(f, name))      # the same value: allowed, no change
    expect_errno(errno.ENODATA, os.getxattr, f, "user.gpu.nothing")
    expect_errno(errno.ENODATA, os.getxattr, f, "user.other")
    expect_errno(errno.ENODATA, os.getxattr, f, "security.capability")
    expect_errno(errno.ENOTSUP, os.setxattr, f, "user.gpu.nothing", b"1")
    expect_errno(errno.ENOTSUP, os.setxattr, f, "security.other", b"1")
    expect_errno(errno.ENODATA, os.removexattr, f, "user.other")   # user metadata, not set
    # (other user.* names are the node's user metadata: test_user_xattrs.py)
    expect_errno(errno.EPERM, os.removexattr, f, "user.gpu.size")
    os.setxattr(f, "user.gpu.durable", b"true")
    os.removexattr(f, "user.gpu.durable")                 # = transient
    assert get(f, "user.gpu.durable") == "false"
    d = os.path.join(mounted.mnt, "d")
    os.mkdir(d)
    assert os.listxattr(d) == []
    expect_errno(errno.ENODATA, os.getxattr, d, "user.gpu.size")
    expect_errno(errno.ENOTSUP, os.setxattr, d, "user.gpu.size", b"1M")


def test_resize_refused_while_a_client_holds_an_fd(mounted):
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.setxattr(f, "user.gpu.size", b"1M")
    with mounted.client() as client:
        handle = client.open("f", "r")
        expect_errno(errno.EBUSY, os.setxattr, f, "user.gpu.size", b"8M")
        expect_errno(errno.EBUSY, os.truncate, f, 8 * MiB)
        handle.close()
    os.setxattr(f, "user.gpu.size", b"8M")
    assert os.stat(f).st_size == 8 * MiB


def test_device_full_is_enospc(mounted):
    """A size the device could hold, but not with what is free now (larger than any device:
    EFBIG, test_setid_atime_efbig.py)."""
    total = max(d["total"] for d in mounted.cli_json("devices"))
    mounted.cli("create", "hog", "--size", str(total // 2), check=True)
    f = os.path.join(mounted.mnt, "f")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    wanted = total * 3 // 4 // MiB * MiB
    expect_errno(errno.ENOSPC, os.setxattr, f, "user.gpu.size", str(wanted).encode())
    expect_errno(errno.ENOSPC, os.truncate, f, wanted)
    fd = os.open(f, os.O_WRONLY)
    try:
        expect_errno(errno.ENOSPC, os.pwrite, fd, b"x", wanted)
    finally:
        os.close(fd)
    assert get(f, "user.gpu.state") == "pending"
    mounted.cli("rm", "hog", check=True)
    os.setxattr(f, "user.gpu.size", str(wanted).encode())       # room again: it fits
    assert os.stat(f).st_size == wanted


def test_durable_via_xattr_survives_kill9(mounted):
    f = os.path.join(mounted.mnt, "keep")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY))
    os.setxattr(f, "user.gpu.durable", b"true")
    data = os.urandom(3 * MiB + 17)
    with open(f, "r+b") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    t = os.path.join(mounted.mnt, "scratch")
    with open(t, "wb") as fh:
        fh.write(b"transient")
    mounted.kill9()
    mounted.start()
    with open(f, "rb") as fh:
        assert fh.read() == data
    assert get(f, "user.gpu.durable") == "true" and get(f, "user.gpu.state") == "ready"
    assert not os.path.exists(t)
    mounted.cli("check", check=True)
