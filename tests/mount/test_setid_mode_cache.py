"""Issue 12, section 2 (set-id bits), as a program that asks the kernel for the mode alone
sees it: `stat -c %a` is statx(2) with mask STATX_MODE.

When the daemon itself clears S_ISUID/S_ISGID at a write (a write-only open is direct I/O: the
kernel sends no setattr of its own, daemon/fs/files.py Files.drop_setid), the kernel, unless
told, keeps the old mode in its attribute cache, valid for ENTRY_TIMEOUT (5 s). After a write
the kernel invalidates only size and times, so a statx asking for STATX_MODE alone was answered
from that cache: 4777 for up to 5 s, although `info` said 0777. A plain stat(2) asks for size
too and refetches, which is why test_setid_atime_efbig.py passed. Controls: O_TRUNC (the daemon
clears the bits inside the open, and the kernel refetches the attributes after an atomic
O_TRUNC) and a write through the page cache (O_RDWR: the kernel clears the bits with its own
setattr, so it knows the new mode).

So after Files.drop_setid changes a mode, daemon/fs/ drops the kernel's cached attributes of
that inode (attributes only, as _note_read does with fs_cache.invalidate: no page lock)."""
from __future__ import annotations

import ctypes
import os
import stat
import sys
import time

import pytest

from tests.users import run_as

AT_FDCWD, AT_SYMLINK_NOFOLLOW, STATX_MODE = -100, 0x100, 0x0002
STX_MODE_OFFSET = 28            # struct statx: mask, blksize, attributes, nlink, uid, gid, mode
CACHE_SECONDS = 5.0             # daemon/fs/attrs.py ENTRY_TIMEOUT
_libc = ctypes.CDLL(None, use_errno=True)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root"),
    pytest.mark.skipif(not hasattr(_libc, "statx"), reason="no statx(2) in this libc"),
]


def statx_mode(path: str) -> int:
    """The permission bits from statx(2) asking for STATX_MODE only (as `stat -c %a` does)."""
    buf = ctypes.create_string_buffer(256)
    if _libc.statx(AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW, STATX_MODE, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    raw = buf.raw[STX_MODE_OFFSET:STX_MODE_OFFSET + 2]
    return stat.S_IMODE(int.from_bytes(raw, sys.byteorder))


def _nobody_writes(path: str, how: str) -> bool:
    def act():
        if how == "o_trunc":
            os.close(os.open(path, os.O_WRONLY | os.O_TRUNC))
            return True
        fd = os.open(path, os.O_WRONLY if how == "write-only" else os.O_RDWR)
        try:
            os.pwrite(fd, b"nobody", 0)
        finally:
            os.close(fd)
        return True

    return run_as(act)


@pytest.mark.parametrize("how", [
    "write-only",                                 # direct I/O: _drop_setid at write
    "o_trunc",                                    # atomic O_TRUNC: the kernel refetches
    "read-write",                                 # page cache: the kernel's own setattr
])
def test_a_mode_only_stat_sees_the_bits_cleared_at_once(mounted, how):
    f = os.path.join(mounted.mnt, "f")
    with open(f, "wb") as fh:
        fh.write(b"old contents")
    os.chmod(f, 0o4777)
    started = time.monotonic()
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4777      # fills the kernel's cache
    assert _nobody_writes(f, how) is True
    seen = statx_mode(f)
    if time.monotonic() - started > CACHE_SECONDS - 1:
        pytest.skip("the machine was too slow: the cached attributes may have expired")
    assert mounted.cli_json("info", "f")["mode"] == "0777"     # the daemon cleared it
    assert seen == 0o777, f"statx(STATX_MODE) answered {seen:04o}, the daemon has 0777"
