"""WRITE requests served by the init-flags library (issue 29; daemon/fs/_fuseinit.c,
docs/mount.md "Writes from C"): the daemon's write handler is called at once with a view of
libfuse's buffer, instead of through pyfuse3's copy and coroutine. What a user observes: the
bytes read back (every way a file is read) are those written, through either path, by either
user; the daemon's errors still reach write(2); and the daemon's log at unmount counts the
WRITEs that took the direct path (none with GPUMEMD_FUSE_WRITES=pyfuse3)."""
from __future__ import annotations

import errno
import mmap
import os

import pytest

from daemon.fs.mount import write_path
from tests.harness import MOUNT_BACKEND
from tests.users import NOBODY, run_as

from .test_init_flags import _asked, _unmount_counts

MiB = 1 << 20
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def _write_mixed(mnt: str) -> dict[str, bytes]:
    """Whole MiBs through a write-only descriptor (direct I/O on the mount), small unaligned
    writes through a read-write one (the page cache, written through), and a sparse write
    past the end: what each file must read back."""
    want = {}
    big = [os.urandom(MiB) for _ in range(4)]
    fd = os.open(os.path.join(mnt, "big"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in big:
            assert os.write(fd, chunk) == MiB
    finally:
        os.close(fd)
    want["big"] = b"".join(big)
    small = bytearray(os.urandom(10_000))
    fd = os.open(os.path.join(mnt, "small"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, small)
        os.pwrite(fd, b"overwritten", 4097)
        small[4097:4097 + 11] = b"overwritten"
        os.pwrite(fd, b"tail", 20_000)                  # the gap reads as zeros
        small += bytes(20_000 - len(small)) + b"tail"
        os.fsync(fd)
    finally:
        os.close(fd)
    want["small"] = bytes(small)
    return want


def _read_back(d, want: dict[str, bytes]) -> None:
    for name, data in want.items():
        with open(os.path.join(d.mnt, name), "rb") as f:
            assert f.read() == data, name
        assert d.cli("read", name, "-", env=d.extra_env, check=True).stdout == data, name


def exercise(d) -> tuple[int, int, int]:
    """Every write and read below on daemon `d` (skipped where the library is missing),
    then its stop: the counts of its unmount's log line."""
    _asked(d)
    _read_back(d, _write_mixed(d.mnt))
    _reads_of_every_kind(d)
    d.stop()
    return _unmount_counts(d)


def test_writes_take_the_direct_path_and_read_back(mounted_factory):
    _, direct, pinned = exercise(mounted_factory())
    assert direct >= 4 + 4 + 1      # 4 MiB writes, 4 small ones at least, the hole's tail
    # On cuda each from the library's own page-locked buffer; the host backend leaves
    # libfuse its own (test_direct_writes_fake.py checks the lending in CI).
    assert pinned == (direct if MOUNT_BACKEND == "cuda" else 0)


def test_pyfuse3_path_reads_back_the_same(mounted_factory):
    assert exercise(mounted_factory(env={"GPUMEMD_FUSE_WRITES": "pyfuse3"}))[1:] == (0, 0)


def _reads_of_every_kind(d) -> None:
    """Bytes the daemon wrote (its socket API), read through the mount at odd offsets and
    sizes, past the end, from a hole, by mmap and from a `.metadata` file."""
    data = os.urandom(3 * MiB + 123)
    d.cli("create", "r", "--size", str(len(data)), env=d.extra_env, check=True)
    d.cli("write", "r", "-", input=data, env=d.extra_env, check=True)
    path = os.path.join(d.mnt, "r")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)      # every read a READ request
    try:
        buf = mmap.mmap(-1, 2 * MiB)                    # O_DIRECT wants aligned memory
        for offset, size in ((0, 4096), (MiB, 2 * MiB), (3 * MiB, MiB)):
            n = os.preadv(fd, [memoryview(buf)[:size]], offset)
            assert buf[:n] == data[offset:offset + size], (offset, size)
        assert os.preadv(fd, [memoryview(buf)[:4096]], 4 * MiB) == 0    # past the end
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == data
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[MiB:MiB + 100] == data[MiB:MiB + 100] and m[-5:] == data[-5:]
    hole = os.path.join(d.mnt, "hole")
    with open(hole, "wb") as f:
        f.truncate(MiB)
        f.seek(MiB - 4)
        f.write(b"tail")
    with open(hole, "rb") as f:
        assert f.read() == bytes(MiB - 4) + b"tail"
    with open(os.path.join(d.mnt, ".metadata", "r"), "rb") as f:
        assert b'"size"' in f.read()


def test_the_daemons_refusals_reach_write(mounted_factory):
    """EFBIG for an offset no device could hold (the quota's EDQUOT: test_quota.py): the
    data before the refused write stays, and the size is what was written."""
    d = mounted_factory()
    _asked(d)
    path = os.path.join(d.mnt, "f")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.write(fd, b"kept" * 1024) == 4096
        with pytest.raises(OSError) as failure:
            os.pwrite(fd, b"x" * 4096, 1 << 60)
        assert failure.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    assert os.stat(path).st_size == 4096
    with open(path, "rb") as f:
        assert f.read() == b"kept" * 1024
    d.stop()
    assert _unmount_counts(d)[1] >= 2


def test_a_bad_setting_names_what_is_allowed(monkeypatch):
    monkeypatch.setenv("GPUMEMD_FUSE_WRITES", "splice")
    with pytest.raises(ValueError, match="GPUMEMD_FUSE_WRITES: invalid 'splice': expected "
                                         "one of direct, pyfuse3"):
        write_path()

    monkeypatch.setenv("GPUMEMD_FUSE_WRITES", "pyfuse3")
    assert write_path() == "pyfuse3"
    monkeypatch.delenv("GPUMEMD_FUSE_WRITES")
    assert write_path() == "direct"


# ---- another user -----------------------------------------------------------------------------
def _nobody_writes(path: str, seed: int, rounds: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(rounds):
            os.pwrite(fd, bytes([seed + i % 7]) * MiB, i * MiB)
    finally:
        os.close(fd)
    return rounds


@root_only
def test_two_users_writing_at_once_get_only_their_own_bytes(mounted_factory):
    """The view the daemon is handed is libfuse's one receive buffer, overwritten by the next
    request: anything that kept it past the call would put one user's bytes in another's
    file. Root and uid 65534 write at once, each a MiB at a time; each file holds exactly
    what its own writer wrote, and the other user can neither read nor write root's."""
    d = mounted_factory()
    _asked(d)
    shared = os.path.join(d.mnt, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    theirs, mine = os.path.join(shared, "theirs"), os.path.join(shared, "mine")
    rounds = 24
    pid = os.fork()
    if pid == 0:                                         # root's writer, beside nobody's
        try:
            _nobody_writes(mine, 100, rounds)
        finally:
            os._exit(0)
    assert run_as(_nobody_writes, theirs, 1, rounds, uid=NOBODY, gid=NOBODY) == rounds
    assert os.waitpid(pid, 0)[1] == 0
    for path, seed in ((theirs, 1), (mine, 100)):
        with open(path, "rb") as f:
            got = f.read()
        assert got == b"".join(bytes([seed + i % 7]) * MiB for i in range(rounds)), path
    assert os.stat(theirs).st_uid == NOBODY

    def attack(path: str) -> list[str]:
        out = []
        for flags in (os.O_WRONLY, os.O_RDONLY):
            try:
                os.close(os.open(path, flags))
                out.append("opened")
            except OSError as exc:
                out.append(errno.errorcode[exc.errno])
        return out

    assert run_as(attack, mine, uid=NOBODY, gid=NOBODY) == ["EACCES", "EACCES"]
