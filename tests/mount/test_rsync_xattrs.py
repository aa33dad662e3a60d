"""`rsync -aX` into the mount and back out (issue 27, item 4). rsync copies extended
attributes: it lists the destination's, removes those the source lacks and sets the
source's. Our user.gpu.* used to be listed, so rsync tried to remove them (EPERM: exit 23)
and copied them out of the mount onto other filesystems. They are read and set by name only
now (docs/mount.md, "Extended attributes"), as CephFS keeps `ceph.*` out of listxattr."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .posix import MiB

needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None,
                                 reason="rsync missing (apt-get install -y rsync)")
needs_getfattr = pytest.mark.skipif(shutil.which("getfattr") is None,
                                    reason="getfattr missing (apt-get install -y attr)")


def rsync(*args: str) -> None:
    proc = subprocess.run(["rsync", "-aX", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"rsync -aX {' '.join(args)}: exit {proc.returncode}\n" \
                                 f"{proc.stderr}"


@needs_rsync
@pytest.mark.parametrize("size", [5000, 3 * MiB + 7])
def test_rsync_aX_in_and_out_keeps_bytes_and_user_attributes(mounted, tmp_path, size):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(size)
    f = src / "weights.bin"
    f.write_bytes(data)
    os.setxattr(f, "user.color", b"blue")
    rsync(str(f), mounted.mnt + "/")                          # a file into the mount
    inside = os.path.join(mounted.mnt, "weights.bin")
    with open(inside, "rb") as back:
        assert back.read() == data
    assert os.listxattr(inside) == ["user.color"]
    assert os.getxattr(inside, "user.color") == b"blue"
    assert os.getxattr(inside, "user.gpu.size") == str(size).encode()   # by name, still
    rsync(str(src) + "/", mounted.mnt + "/again/")            # a tree, over the same name
    rsync(inside, str(tmp_path / "out") + "/")                # and back out
    out = tmp_path / "out" / "weights.bin"
    assert out.read_bytes() == data
    assert os.listxattr(out) == ["user.color"]                # no user.gpu.* came out
    rsync(inside, inside + ".copy")                           # within the mount
    assert os.listxattr(inside + ".copy") == ["user.color"]


@needs_getfattr
def test_getfattr_d_lists_no_user_gpu_names(mounted):
    f = os.path.join(mounted.mnt, "f")
    with open(f, "wb") as out:
        out.write(b"x" * 100)
    os.setxattr(f, "user.note", b"kept")
    d = os.path.join(mounted.mnt, "d")
    os.mkdir(d)
    os.setxattr(d, "user.gpu.durable", b"true")
    for path, want in ((f, ['user.note="kept"']), (d, [])):
        dump = subprocess.run(["getfattr", "-d", "-m", "-", path], capture_output=True,
                              text=True, check=True).stdout
        assert [line for line in dump.splitlines()[1:] if line] == want, dump
    named = subprocess.run(["getfattr", "-n", "user.gpu.durable", d], capture_output=True,
                           text=True, check=True).stdout
    assert 'user.gpu.durable="true"' in named
