"""`HostMapping`: an allocation of the host backend mapped into this process by attach(),
with libc's mmap, so that its address is known and can be kept.

Python's mmap object hides the address of a read-only mapping and cannot place a mapping at
an address of our choosing: both are what an attachment needs. Its `ptr` is handed to numpy
(or torch on the CPU) through DLPack, and across a sleep and wake of the allocation it must
stay the same (gpumemctl/sleepwake.py): park() replaces the mapping of the memfd by an
inaccessible anonymous one over the same range (the address stays reserved, the memfd's
pages are no longer mapped here, so the daemon may free them), and remap() maps the new memfd
over it with MAP_FIXED.
"""
from __future__ import annotations

import ctypes
import mmap
import os

from .protocol import InvalidState

# Linux's values (x86-64 and arm64 alike), which Python's mmap module (3.11) does not name.
PROT_NONE = 0
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
_FAILED = ctypes.c_void_p(-1).value


class HostMapping:
    """A memfd mapped at a known address. A read-only mapping is PROT_READ: a store through
    `ptr` kills the process with SIGSEGV; so does any access while parked."""

    _libc: ctypes.CDLL | None = None

    def __init__(self, fd: int, capacity: int, writable: bool, offset: int = 0):
        self.capacity, self.writable, self.device, self.parked = capacity, writable, 0, False
        self.prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            self.ptr: int = self._mmap(None, self.prot, mmap.MAP_SHARED, fd, offset)
        finally:
            os.close(fd)

    def _mmap(self, at: int | None, prot: int, flags: int, fd: int, offset: int) -> int:
        addr = self._load_libc().mmap(at, self.capacity, prot, flags, fd, offset)
        err = ctypes.get_errno()
        if addr is None or addr == _FAILED:
            raise OSError(err, f"mmap of the allocation failed: {os.strerror(err)}")
        if at is not None and addr != at:       # MAP_FIXED puts it there or fails
            raise OSError(0, f"mmap placed the allocation at {addr:#x}, not {at:#x}")
        return addr

    @classmethod
    def _load_libc(cls) -> ctypes.CDLL:
        if cls._libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long]
            libc.munmap.restype = ctypes.c_int
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            cls._libc = libc
        return cls._libc

    def read(self, offset: int, length: int) -> bytes:
        return ctypes.string_at(self.ptr + offset, length)

    def write(self, offset: int, data) -> None:
        if not self.writable:
            raise InvalidState("attached read-only: writing is not allowed")
        src = bytes(data)
        ctypes.memmove(self.ptr + offset, src, len(src))

    def park(self) -> None:
        """Let go of the memfd's pages but keep the range: PROT_NONE anonymous memory that
        reserves nothing (MAP_NORESERVE) takes its place, atomically (MAP_FIXED)."""
        if self.ptr and not self.parked:
            self._mmap(self.ptr, PROT_NONE,
                       MAP_FIXED | mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
            self.parked = True

    def remap(self, fd: int, offset: int = 0) -> None:
        """Map the allocation's memory now (`fd`, closed here; `offset` into it for a slot
        of a slab) over the parked range, with the access it had."""
        try:
            if not self.parked:
                raise InvalidState("remap of a mapping that is not parked")
            self._mmap(self.ptr, self.prot, MAP_FIXED | mmap.MAP_SHARED, fd, offset)
            self.parked = False
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.ptr:
            self._load_libc().munmap(self.ptr, self.capacity)
            self.ptr = 0
