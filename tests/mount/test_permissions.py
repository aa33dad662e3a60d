"""A second uid on the mount: the kernel (default_permissions, allow_other as root) and the
manager apply the same POSIX rules. The child drops to nobody (65534) by fork + setuid
(tests/users.py run_as)."""
from __future__ import annotations

import errno
import os

import pytest

from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def outcome(fn, *args):
    try:
        value = fn(*args)
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return value.hex() if isinstance(value, bytes) else value


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def write_file(path, data=b"nobody was here"):
    with open(path, "wb") as f:
        return f.write(data)


def test_second_uid_on_the_mount(mounted):
    mnt = mounted.mnt
    private, shared = os.path.join(mnt, "private"), os.path.join(mnt, "shared")
    write_file(private, b"secret")
    os.chmod(private, 0o600)                   # open(2)'s mode and the umask decided; be sure
    write_file(shared, b"public")
    os.chmod(shared, 0o644)
    os.mkdir(os.path.join(mnt, "closed"), 0o700)

    def as_nobody():
        mine = os.path.join(mnt, "mine")
        return {
            "read private": outcome(read_file, private),
            "read shared": outcome(read_file, shared),
            "write shared": outcome(write_file, shared),
            "chmod shared": outcome(os.chmod, shared, 0o666),
            "durable shared": outcome(os.setxattr, shared, "user.gpu.durable", b"true"),
            "size shared": outcome(os.setxattr, shared, "user.gpu.size", b"4M"),
            "list closed": outcome(os.listdir, os.path.join(mnt, "closed")),
            "create in closed": outcome(write_file, os.path.join(mnt, "closed", "x")),
            "create mine": outcome(write_file, mine),
            "owner of mine": os.stat(mine).st_uid,
            "durable mine": outcome(os.setxattr, mine, "user.gpu.durable", b"true"),
            "unlink root's (sticky /)": outcome(os.unlink, shared),
            "metadata of private": outcome(lambda: len(read_file(
                os.path.join(mnt, ".metadata", "private"))) > 0),
        }

    got = run_as(as_nobody)
    assert got == {
        "read private": "EACCES", "read shared": b"public".hex(), "write shared": "EACCES",
        "chmod shared": "EPERM", "durable shared": "EACCES", "size shared": "EACCES",
        "list closed": "EACCES", "create in closed": "EACCES", "create mine": 15,
        "owner of mine": NOBODY, "durable mine": None, "unlink root's (sticky /)": "EPERM",
        "metadata of private": True}
    info = mounted.cli_json("info", "mine")
    assert (info["uid"], info["durable"]) == (NOBODY, True)
    assert read_file(private) == b"secret"                # root still reads everything
