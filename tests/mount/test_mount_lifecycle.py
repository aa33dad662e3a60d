"""The mount's life: a clean stop unmounts; a kill -9 leaves a dead mount that the next start
cleans, and durable files read back; a mount point that is another live mount is refused."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.harness import is_mounted

from .posix import MiB


def test_sigterm_unmounts(mounted):
    with open(os.path.join(mounted.mnt, "f"), "wb") as f:
        f.write(b"x")
    assert mounted.mounted()
    assert mounted.stop() == 0
    assert not is_mounted(mounted.mnt)
    assert "unmounted" in mounted.log()


def test_kill9_then_restart_cleans_the_stale_mount(mounted):
    mnt = mounted.mnt
    durable = os.urandom(5 * MiB + 3)
    with open(os.path.join(mnt, "d"), "wb") as f:
        os.setxattr(f.fileno(), "user.gpu.durable", b"true")
        f.write(durable)
    busy = os.open(os.path.join(mnt, "d"), os.O_RDONLY)     # a descriptor survives the crash
    mounted.kill9()
    with pytest.raises(OSError) as exc:
        os.statvfs(mnt)
    assert exc.value.strerror == "Transport endpoint is not connected"
    with pytest.raises(OSError):
        os.pread(busy, 10, 0)
    os.close(busy)
    mounted.start()
    assert "is a stale mount (its daemon died); unmounting it" in mounted.log()
    with open(os.path.join(mnt, "d"), "rb") as f:
        assert f.read() == durable
    assert os.listdir(mnt) == ["d"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_refuses_a_mount_point_that_is_another_mount(mounted_factory):
    d = mounted_factory(start=False)
    os.makedirs(d.mnt)
    subprocess.run(["mount", "-t", "tmpfs", "none", d.mnt], check=True)
    try:
        d.start(wait=False)
        assert d.proc.wait(30) == 1
        assert f"gpumemd: {d.mnt} is already a mount point (tmpfs); unmount it or choose " \
               "another --mount" in d.log()
    finally:
        subprocess.run(["umount", d.mnt], check=True)


def test_two_daemons_cannot_share_a_mount_point(mounted, daemon_factory):
    other = daemon_factory(start=False, extra_args=["--mount", mounted.mnt,
                                                    "--host-capacity", "1G"])
    other.start(wait=False)
    assert other.proc.wait(30) == 1
    assert "is already a mount point (fuse.gpumem" in other.log()
    assert os.statvfs(mounted.mnt).f_blocks > 0          # the first one still serves
