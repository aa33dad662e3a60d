"""The host tier: where an asleep allocation's bytes wait (daemon/core/sleep.py).

A memfd, not the driver's pinned allocation (cuMemHostAlloc): a durable allocation must
survive a kill -9 of the daemon while asleep, so the keeper holds an fd of its bytes as it
holds device memory, and only a memfd can be handed over. On the cuda backend the mapping is
registered with the driver (cuMemHostRegister) for as long as it is mapped here, so that the
copies run by DMA at the pinned rate; registration is an optimisation only: if the driver
refuses it, the copies still work from pageable memory, slower.

Its pages are made before the copy (MADV_POPULATE_WRITE over slices, on several threads):
a copy into untouched memory faults every 4 KiB page on the copying thread, and the kernel's
zeroing of new pages is what limits a single thread to a few GB/s. Huge pages are asked for
(MADV_HUGEPAGE): where the kernel gives them to shared memory (transparent_hugepage's
shmem_enabled "advise" or "within_size"), making the pages costs a fraction.

Making and pinning 16 GiB of pages takes seconds where the copy takes a third of one (the
H100 machine: docs/engines.md, "Sleep and wake"), so a tier a wake lets go of is kept for a
while (Spares): an engine that switches between models wakes one and puts the other to
sleep, and the second sleep reuses the first's memory. Freeing those pages takes seconds
too: it happens on a thread of its own, never on the event loop.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("gpumemd")

MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23          # Linux 5.14; older kernels: EINVAL, the copy faults them in
POPULATE_THREADS = 8
POPULATE_SLICE = 256 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_closer = ThreadPoolExecutor(1, thread_name_prefix="gpumemd-tier-free")

SPARE_SECONDS = 30.0      # how long a tier a wake let go of is kept for the next sleep
SPARE_SLACK = 1.25        # a spare serves sizes down to its capacity / SPARE_SLACK


class HostTier:
    """`size` bytes of host memory in a memfd, mapped read-write in the daemon (module
    docstring). `crc`: a checksum of the bytes, for an allocation whose parity does not stay
    while it sleeps (one packed in a slab: its slot's parity is the slab's)."""

    def __init__(self, fd: int, size: int, crc: int | None = None):
        self.fd, self.size, self.crc = fd, size, crc
        self.capacity = max(size, 1)          # bytes mapped; `size` of them are the data
        self._map = mmap.mmap(fd, self.capacity, mmap.MAP_SHARED,
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

    def reuse(self, size: int) -> None:
        """Serve `size` bytes (at most its capacity) of another allocation: what lies past
        them is never read (reads, the wake's copy and an adoption stop at `size`)."""
        self.view.release()
        self.size, self.crc = size, None
        self.view = memoryview(self._map)[:size]

    def populate(self) -> None:
        """Make every page now, on several threads (the module docstring)."""
        _libc.madvise(self.addr, self.capacity, MADV_HUGEPAGE)
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

    def release(self) -> None:
        """close(), on the tiers' own thread: freeing many pages takes seconds."""
        _closer.submit(self.close)

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


class Spares:
    """Tiers a wake let go of, kept populated and page-locked for SPARE_SECONDS (the module
    docstring); swept by housekeeping, all closed at a stop."""

    def __init__(self, seconds: float = SPARE_SECONDS):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._kept: list[tuple[float, HostTier]] = []

    def take(self, size: int) -> HostTier | None:
        """The smallest spare that holds `size` bytes without wasting more than a quarter."""
        with self._lock:
            fits = [(t.capacity, i) for i, (_, t) in enumerate(self._kept)
                    if size <= t.capacity <= size * SPARE_SLACK + mmap.PAGESIZE]
            if not fits:
                return None
            tier = self._kept.pop(min(fits)[1])[1]
        tier.reuse(size)
        return tier

    def give(self, tier: HostTier) -> None:
        if self.seconds <= 0 or not tier.size:
            tier.release()
            return
        with self._lock:
            self._kept.append((time.monotonic(), tier))

    def sweep(self, now: float | None = None) -> int:
        """Release the spares unused for SPARE_SECONDS; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [t for since, t in self._kept if now - since >= self.seconds]
            self._kept = [(s, t) for s, t in self._kept if now - s < self.seconds]
        for tier in old:
            tier.release()
        return len(old)

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(t.capacity for _, t in self._kept)

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
        for _, tier in kept:
            tier.close()
