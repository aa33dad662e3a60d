"""Symbolic links and special files on a mount, beyond the one-mount helpers of
posix_links.py (issue 15): they survive a restart (clean and kill -9) as directories do; an
absolute target under the mount point is followed by the socket API too; another user and
the sticky root."""
from __future__ import annotations

import errno
import os
import stat

import pytest

from tests.users import NOBODY, run_as


def _links_and_specials(mnt: str) -> None:
    os.mkdir(os.path.join(mnt, "models"))
    with open(os.path.join(mnt, "models", "v2"), "wb") as f:
        f.write(b"weights")
    os.symlink("v2", os.path.join(mnt, "models", "current"))
    os.symlink(os.path.join(mnt, "models", "v2"), os.path.join(mnt, "abs"))
    os.mkfifo(os.path.join(mnt, "fifo"), 0o600)
    os.mknod(os.path.join(mnt, "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))


def _assert_kept(mnt: str) -> None:
    assert os.readlink(os.path.join(mnt, "models", "current")) == "v2"
    assert os.readlink(os.path.join(mnt, "abs")) == os.path.join(mnt, "models", "v2")
    assert stat.S_ISFIFO(os.lstat(os.path.join(mnt, "fifo")).st_mode)
    st = os.lstat(os.path.join(mnt, "null"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


@pytest.mark.parametrize("hard", [False, True], ids=["clean", "kill9"])
def test_links_and_special_files_survive_a_restart(mounted, hard):
    mnt = mounted.mnt
    _links_and_specials(mnt)
    mounted.cli("durable", "models/v2", check=True)
    mounted.restart(hard=hard)
    _assert_kept(mnt)
    assert open(os.path.join(mnt, "models", "current"), "rb").read() == b"weights"
    types = {e["name"]: e["type"] for e in mounted.cli_json("ls", "-R")}
    assert types == {"models": "directory", "v2": "allocation", "current": "symlink",
                     "abs": "symlink", "fifo": "fifo", "null": "char-device"}
    mounted.cli("check", check=True)


def test_an_absolute_target_under_the_mount_point_is_followed_by_the_socket_api(mounted):
    mnt = mounted.mnt
    _links_and_specials(mnt)
    assert mounted.cli("read", "abs", check=True).stdout == b"weights"
    assert mounted.cli_json("info", "abs")["path"] == "models/v2"
    mounted.cli("ln", "-s", os.path.join(mnt, "models"), "m", check=True)   # socket side
    assert open(os.path.join(mnt, "m", "current"), "rb").read() == b"weights"
    assert mounted.cli_json("info", "m/current")["path"] == "models/v2"
    info = mounted.cli_json("info", "null")
    assert (info["type"], info["major"], info["minor"]) == ("char-device", 1, 3)
    mounted.cli("rm", "fifo", "null", "m", check=True)     # removed like any name
    assert not os.path.lexists(os.path.join(mnt, "fifo"))
    mounted.cli("check", check=True)


def _nobody_on_the_mount(mnt: str) -> dict:
    def outcome(fn, *args):
        try:
            fn(*args)
            return "ok"
        except OSError as exc:
            return errno.errorcode[exc.errno]
    mine = os.path.join(mnt, "mine")
    return {
        "read through root's link": outcome(lambda: open(os.path.join(mnt, "to-secret"))),
        "own link to secret": outcome(os.symlink, "secret/plans", mine),
        "read through own link": outcome(lambda: open(mine).read()),
        "lstat own link": os.lstat(mine).st_uid,
        "unlink root's link (sticky /)": outcome(os.unlink, os.path.join(mnt, "to-secret")),
        "unlink own link": outcome(os.unlink, mine),
        "mkfifo in /": outcome(os.mkfifo, os.path.join(mnt, "p")),
        "unlink own fifo": outcome(os.unlink, os.path.join(mnt, "p")),
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_links_of_another_user_on_the_mount(mounted):
    mnt = mounted.mnt
    os.mkdir(os.path.join(mnt, "secret"), 0o700)
    with open(os.path.join(mnt, "secret", "plans"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(mnt, "secret", "plans"), 0o644)
    os.symlink("secret/plans", os.path.join(mnt, "to-secret"))
    assert run_as(_nobody_on_the_mount, mnt) == {
        "read through root's link": "EACCES", "own link to secret": "ok",
        "read through own link": "EACCES", "lstat own link": NOBODY,
        "unlink root's link (sticky /)": "EPERM", "unlink own link": "ok",
        "mkfifo in /": "ok", "unlink own fifo": "ok"}
    mounted.cli("check", check=True)


def test_hard_links_agree_between_the_mount_and_the_socket_api_at_once(mounted):
    """A hard link made or removed through either side is seen by the other at once: the
    kernel's cached st_nlink is dropped when the socket API links or unlinks (issue 15,
    item 6), and a durable file's names survive a kill -9 on the mount too."""
    mnt = mounted.mnt
    a, b = os.path.join(mnt, "a"), os.path.join(mnt, "b")
    with open(a, "wb") as f:
        f.write(b"one file")
    assert os.stat(a).st_nlink == 1                   # cached by the kernel now
    mounted.cli("ln", "a", "b", check=True)
    assert os.stat(a).st_nlink == 2 and os.stat(b).st_ino == os.stat(a).st_ino
    os.link(a, os.path.join(mnt, "c"))
    info = mounted.cli_json("info", "c")
    assert info["names"] == ["a", "b", "c"] and info["links"] == 3
    mounted.cli("rm", "a", check=True)
    assert os.stat(b).st_nlink == 2 and not os.path.exists(a)
    mounted.cli("durable", "b", check=True)
    mounted.restart(hard=True)
    assert os.stat(b).st_nlink == 2 and os.stat(b).st_ino == os.stat(os.path.join(mnt, "c")).st_ino
    with open(os.path.join(mnt, "c"), "rb") as f:
        assert f.read() == b"one file"
    os.unlink(b)
    assert mounted.cli_json("info", "c")["links"] == 1
    mounted.cli("check", check=True)
