"""A modification time set right after a close stays (issue 24, item 18). Before, the close
of a file over 4 MiB ran its parity work on a worker thread, and the step that finished it
gave back the capacity left spare by write growth with a commit that stamped the time
again: `os.utime` right after `close` was lost, 15 runs of 15, and so were the times tar
and `rsync -a` set. Now only a write moves the time, when it happens.

The close's work is observed, not slept on: it is over once the file has no holder left
(`info`). What the kernel shows is read through the `.metadata` mirror (never cached) and,
once, by stat(2) after the kernel's attribute cache has expired."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from daemon.fs.attrs import ENTRY_TIMEOUT
from tests.harness import wait_for

from .posix import MiB, pattern

SET_NS = 1577836800 * 10**9             # 2020-01-01T00:00:00Z
SET_ISO = "2020-01-01T00:00:00.000000Z"


def settled(d, name: str) -> dict:
    """`info` of `name` once the mount's close of it has finished (no holder left)."""
    def done():
        with d.client() as c:
            info = c.info(name)
        return info if not info["holders"] else None
    return wait_for(done, timeout=30, what=f"the close of '{name}' to finish")


def mirror(d, name: str) -> dict:
    with open(os.path.join(d.mnt, ".metadata", name)) as f:
        return json.load(f)


def test_utime_right_after_closing_a_5_MiB_file_stays(mounted):
    path = os.path.join(mounted.mnt, "f")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, pattern(5 * MiB))
    os.close(fd)
    os.utime(path, ns=(SET_NS, SET_NS))
    assert settled(mounted, "f")["modified"] == SET_ISO
    assert mirror(mounted, "f")["modified"] == SET_ISO
    time.sleep(ENTRY_TIMEOUT + 0.5)             # the kernel asks again
    assert os.stat(path).st_mtime_ns == SET_NS
    with open(path, "rb") as f:
        assert f.read() == pattern(5 * MiB)


def test_a_later_write_still_moves_the_time(mounted):
    path = os.path.join(mounted.mnt, "g")
    with open(path, "wb") as f:
        f.write(pattern(5 * MiB))
    os.utime(path, ns=(SET_NS, SET_NS))
    settled(mounted, "g")
    before = time.time_ns()
    with open(path, "r+b") as f:
        f.write(b"new")
    assert settled(mounted, "g")["modified"] > SET_ISO
    assert mirror(mounted, "g")["modified"] > SET_ISO
    assert before > SET_NS


def _tree(src: str) -> dict[str, int]:
    """Three files over 4 MiB with times in the past, one second apart."""
    times = {}
    os.makedirs(os.path.join(src, "d"))
    for i, name in enumerate(("a.bin", "d/b.bin", "d/c.bin")):
        path = os.path.join(src, name)
        with open(path, "wb") as f:
            f.write(pattern(5 * MiB + i * 4096, seed=i))
        times[name] = SET_NS + i * 10**9
        os.utime(path, ns=(times[name], times[name]))
    return times


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(ns // 10**9))


def test_tar_x_keeps_the_times_of_large_files(mounted, tmp_path):
    times = _tree(str(tmp_path / "src"))
    archive = tmp_path / "tree.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tmp_path / "src", arcname="x")
    subprocess.run(["tar", "-xf", str(archive), "-C", mounted.mnt], check=True)
    for name, ns in times.items():
        assert settled(mounted, f"x/{name}")["modified"] == _iso(ns), name
        assert mirror(mounted, f"x/{name}")["modified"] == _iso(ns), name


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_a_keeps_the_times_of_large_files(mounted, tmp_path):
    times = _tree(str(tmp_path / "src"))
    subprocess.run(["rsync", "-a", f"{tmp_path / 'src'}/", os.path.join(mounted.mnt, "y")],
                   check=True)
    for name, ns in times.items():
        assert settled(mounted, f"y/{name}")["modified"] == _iso(ns), name
