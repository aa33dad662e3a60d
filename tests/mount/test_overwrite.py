"""Overwriting a file on the mount (issue 12, section 1): open(2) with O_TRUNC empties an
existing file, so what a shell redirection, cp, dd or a program writes is all that is left.

Each case starts from old content longer than the new and compares the bytes read back. The
times are set far in the past first, so "mtime moved" cannot pass by accident."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from tests.users import run_as

from .posix import MiB, expect_errno, pattern

OLD_NS = 1_000_000_000          # 1970-01-01T00:00:01: any real update is later


def write_old(path: str, data: bytes) -> os.stat_result:
    with open(path, "wb") as fh:
        fh.write(data)
    os.utime(path, ns=(OLD_NS, OLD_NS))
    return os.stat(path)


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def assert_times_moved(path: str, before: os.stat_result) -> None:
    after = os.stat(path)
    assert after.st_mtime_ns > OLD_NS, "mtime did not move"
    assert after.st_ctime_ns > before.st_ctime_ns, "ctime did not move"


def test_shell_redirection_replaces_the_contents(mounted):
    f = os.path.join(mounted.mnt, "f")
    subprocess.run(["sh", "-c", f"printf 'this is a long line\\n' > {f}"], check=True)
    before = os.stat(f)
    os.utime(f, ns=(OLD_NS, OLD_NS))
    subprocess.run(["sh", "-c", f"printf 'ab\\n' > {f}"], check=True)
    assert read(f) == b"ab\n"
    assert os.stat(f).st_size == 3
    assert_times_moved(f, before)


def test_cp_over_a_longer_file(mounted, tmp_path):
    f = os.path.join(mounted.mnt, "f")
    before = write_old(f, pattern(5 * MiB + 7, seed=1))
    small = tmp_path / "small.txt"
    small.write_bytes(b"small file\n")
    subprocess.run(["cp", str(small), f], check=True)
    assert read(f) == b"small file\n"
    assert_times_moved(f, before)


@pytest.mark.slabs_off
def test_dd_replaces_and_the_memory_shrinks(mounted):
    f = os.path.join(mounted.mnt, "f")
    before = write_old(f, pattern(4 * MiB))
    assert os.getxattr(f, "user.gpu.capacity") == str(4 * MiB).encode()
    subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=1M", "count=1", "status=none"],
                   check=True)
    assert os.stat(f).st_size == MiB
    assert read(f) == bytes(MiB)
    # the truncation gave the memory back, as truncate(2) does: one 2 MiB granule is left
    assert os.getxattr(f, "user.gpu.capacity") == str(2 * MiB).encode()
    assert_times_moved(f, before)


def test_os_open_o_trunc(mounted):
    f = os.path.join(mounted.mnt, "f")
    before = write_old(f, pattern(3 * MiB))
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    assert os.stat(f).st_size == 0 and read(f) == b""
    assert_times_moved(f, before)
    assert mounted.cli_json("info", "f")["size"] == 0


def test_o_trunc_of_an_empty_file_still_moves_the_times(mounted):
    """POSIX: O_TRUNC on an existing file marks mtime and ctime for update."""
    f = os.path.join(mounted.mnt, "f")
    before = write_old(f, b"")
    os.close(os.open(f, os.O_RDWR | os.O_TRUNC))
    assert os.stat(f).st_size == 0
    assert_times_moved(f, before)


def test_o_trunc_with_read_only_access_truncates(mounted):
    """Linux truncates on O_RDONLY|O_TRUNC too (the kernel asks for write permission)."""
    f = os.path.join(mounted.mnt, "f")
    write_old(f, b"old bytes")
    fd = os.open(f, os.O_RDONLY | os.O_TRUNC)
    try:
        assert os.read(fd, 100) == b""
    finally:
        os.close(fd)
    assert os.stat(f).st_size == 0


def test_o_trunc_while_a_socket_client_has_it_open_is_ebusy(mounted):
    """As truncate(2): a socket client holds an fd to the memory, so it cannot change."""
    f = os.path.join(mounted.mnt, "f")
    write_old(f, b"kept while busy")
    with mounted.client() as client:
        handle = client.open("f", "r")
        expect_errno(errno.EBUSY, os.open, f, os.O_WRONLY | os.O_TRUNC)
        expect_errno(errno.EBUSY, os.truncate, f, 0)
        handle.close()
    assert read(f) == b"kept while busy"
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))          # free again
    assert os.stat(f).st_size == 0


def test_overwriting_a_durable_file_keeps_its_parity_and_survives_kill9(mounted):
    """The trim re-encodes the parity (ECC): a verify finds nothing wrong, and the new
    contents are what comes back after a crash and restart."""
    f = os.path.join(mounted.mnt, "keep")
    write_old(f, pattern(6 * MiB + 5))
    os.setxattr(f, "user.gpu.durable", b"true")
    new = pattern(MiB + 3, seed=9)
    with open(f, "wb") as fh:             # O_TRUNC, then the new bytes; close syncs them
        fh.write(new)
    assert read(f) == new
    assert os.getxattr(f, "user.gpu.capacity") == str(2 * MiB).encode()
    mounted.cli("verify", "keep", check=True)
    mounted.restart()
    assert read(f) == new
    mounted.cli("verify", "keep", check=True)
    mounted.cli("check", check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_o_trunc_needs_write_permission(mounted):
    f = os.path.join(mounted.mnt, "f")
    write_old(f, b"root's bytes")
    os.chmod(f, 0o644)

    def truncate_as_nobody():
        try:
            os.close(os.open(f, os.O_RDONLY | os.O_TRUNC))
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "opened"

    assert run_as(truncate_as_nobody) == "EACCES"
    assert read(f) == b"root's bytes"


def test_cp_of_a_tree_onto_itself_elsewhere(mounted, tmp_path):
    """`cp -r` over an existing copy: every file holds the new bytes only."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"A" * 10)
    (src / "b").write_bytes(b"B" * 3)
    dest = os.path.join(mounted.mnt, "tree")
    os.mkdir(dest)
    write_old(os.path.join(dest, "a"), b"x" * 5000)
    write_old(os.path.join(dest, "b"), b"y" * 5000)
    shutil.copytree(src, dest, dirs_exist_ok=True)
    assert read(os.path.join(dest, "a")) == b"A" * 10
    assert read(os.path.join(dest, "b")) == b"B" * 3
