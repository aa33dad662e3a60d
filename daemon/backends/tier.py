"""The host tier: where an asleep allocation's bytes wait (daemon/core/sleep.py).

A memfd, not the driver's pinned allocation (cuMemHostAlloc): a durable allocation must
survive a kill -9 of the daemon while asleep, so the keeper holds an fd of its bytes as it
holds device memory, and only a memfd can be handed over. On the cuda backend the mapping is
registered with the driver (cuMemHostRegister) for as long as it is mapped here, so that the
copies run by DMA at the pinned rate; registration is an optimisation only: if the driver
refuses it, the copies still work from pageable memory, slower.

Its pages are made before the copy (MADV_POPULATE_WRITE over slices, on several threads):
a copy into untouched memory faults every 4 KiB page on the copying thread, and the kernel's
zeroing of new pages is what limits a single thread to a few GB/s.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("gpumemd")

MADV_POPULATE_WRITE = 23          # Linux 5.14; older kernels: EINVAL, the copy faults them in
POPULATE_THREADS = 8
POPULATE_SLICE = 256 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


class HostTier:
    """`size` bytes of host memory in a memfd, mapped read-write in the daemon (module
    docstring). `crc`: a checksum of the bytes, for an allocation whose parity does not stay
    while it sleeps (one packed in a slab: its slot's parity is the slab's)."""

    def __init__(self, fd: int, size: int, crc: int | None = None):
        self.fd, self.size, self.crc = fd, size, crc
        self._map = mmap.mmap(fd, max(size, 1), mmap.MAP_SHARED,
                              mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self._map)[:size]
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._unregister = None

    @classmethod
    def create(cls, size: int, label: str) -> HostTier:
        fd = os.memfd_create(f"gpumem-asleep:{label}"[:249], os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)        # as the host backend's memfds: no reopen by others
            os.ftruncate(fd, max(size, 1))
            tier = cls(fd, size)
        except BaseException:
            os.close(fd)
            raise
        tier.populate()
        return tier

    def populate(self) -> None:
        """Make every page now, on several threads (the module docstring)."""
        slices = [(off, min(POPULATE_SLICE, self.size - off))
                  for off in range(0, self.size, POPULATE_SLICE)]
        if len(slices) <= 1:
            return
        with ThreadPoolExecutor(min(POPULATE_THREADS, len(slices))) as pool:
            results = list(pool.map(lambda s: _libc.madvise(self.addr + s[0], s[1],
                                                            MADV_POPULATE_WRITE), slices))
        if any(results):
            log.debug("MADV_POPULATE_WRITE refused (errno %d): pages made at the copy",
                      ctypes.get_errno())

    def register(self, register, device: str) -> None:
        """Page-lock the mapping with `register(addr, size, device)`, which returns its
        undo; a refusal leaves it pageable (the module docstring)."""
        if self._unregister is not None or not self.size:
            return
        try:
            self._unregister = register(self.addr, self.size, device)
        except Exception as exc:  # noqa: BLE001 - an optimisation: pageable memory works
            log.info("the host tier stays pageable (%s): its copies run slower", exc)

    def keeper_fd(self) -> int:
        """A descriptor of its bytes for the keeper (which closes its own copy)."""
        return os.dup(self.fd)

    def close(self) -> None:
        if self._unregister is not None:
            try:
                self._unregister()
            except Exception:
                log.exception("unregistering the host tier failed")
            self._unregister = None
        self.view.release()
        self._map.close()
        os.close(self.fd)
