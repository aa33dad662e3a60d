"""The CUDA ECC codec: RS(136,128) parity and per-block checksums on device memory
(layout, checksum, status codes and rules: docs/ecc.md; constants: layout.py).

The kernels live in kernels.cu beside this file. GpuCodec compiles them (gpuimage.py) with
NVRTC for the device's architecture (a cubin for sm_XY, or PTX for the newest architecture
NVRTC knows when it does not know the device's), caches the result on disk, and loads it
into the device's primary context. Every driver and NVRTC call goes through gpumemctl.cudadrv.

All methods take device pointers into the daemon's own mappings (already offset to the first
block) and a block count n, run on the codec's own stream, and return only when the work is
complete (results on the host; the caller may free the buffers):

    encode(data, parity, cks, n)             write parity (n*8192 bytes) and checksums (n*8)
    verify(data, parity, cks, n)             uint8[n]: 0 CLEAN, 1 DAMAGED
    repair(data, parity, cks, n)             in place: (status uint8[n], corrected int64[n]),
                                             status layout.CLEAN / CORRECTED / UNCORRECTABLE

The cache: `cache_dir`/ecc-<arch>-<sha256 of source and options>.cubin (or .ptx), checked
before it is loaded (gpumemctl/cudadrv/kcache.py: the directory and file must be the daemon's own,
the image must match the SHA-256 in the file's header); written atomically, so concurrent
daemons at worst compile twice. A file that fails the check or fails to load is recompiled
and replaced. `compiled_from_cache` says what this instance did.

Measured on an H100 80GB HBM3 (bench/ecc.py, 8 GiB): encode 2.70 TB/s and verify 2.86 TB/s of
data, beside 3.05 TB/s for a kernel that only reads the same buffer; NVRTC compiles the file in
about 0.25 s, a cached cubin loads in about 1 ms.
"""
from __future__ import annotations

import ctypes
import logging
import threading

import numpy as np

from daemon.ecc.gpuimage import (
    cache_name,
    default_cache_dir,
    load_or_compile,
    prebuild,
    read_source,
)
from daemon.ecc.layout import (
    BLOCK,
    CHECKSUM_BYTES,
    CLEAN,
    CODEWORDS,
    CORRECTED,
    PARITY_BLOCK,
    UNCORRECTABLE,
)
from gpumemctl import cudadrv

log = logging.getLogger(__name__)

WARPS_PER_CTA = 4           # must match ECC_WARPS in kernels.cu (or the -D given in options)
REPAIR_THREADS = CODEWORDS  # ecc_repair: one thread per codeword, one CTA per block
DAMAGED = 1                 # verify()

_c64 = ctypes.c_uint64




class _Scratch:
    """A device buffer and a pinned host buffer of the same size, grown on demand."""

    def __init__(self, device: int):
        self.device, self.size, self.dptr = device, 0, 0
        self.host: cudadrv.PinnedBuffer | None = None

    @property
    def pinned(self) -> cudadrv.PinnedBuffer:
        """The host buffer, which ensure() makes."""
        if self.host is None:
            raise RuntimeError("the ECC scratch buffer is used before ensure()")
        return self.host

    def ensure(self, size: int) -> None:
        if size <= self.size:
            return
        size = max(size, 2 * self.size, 1 << 16)
        self.free()
        self.dptr = cudadrv.mem_alloc(size)
        try:
            self.host = cudadrv.PinnedBuffer(size, self.device)
        except BaseException:
            cudadrv.mem_free(self.dptr)
            self.dptr = 0
            raise
        self.size = size

    def array(self, offset: int, count: int, dtype) -> np.ndarray:
        """A numpy view of the pinned buffer (valid until the next ensure() or free())."""
        return np.frombuffer(self.pinned.view, dtype=dtype, count=count, offset=offset)

    def free(self) -> None:
        if self.dptr:
            cudadrv.mem_free(self.dptr)
            self.dptr = 0
        if self.host is not None:
            self.host.free()
            self.host = None
        self.size = 0


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


class GpuCodec:
    """The ECC codec of one device. Thread-safe (one call at a time); close() when done."""

    def __init__(self, device_index: int = 0, cache_dir: str | None = None, *,
                 options=(), warps_per_cta: int = WARPS_PER_CTA):
        self.device = int(device_index)
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self.warps = int(warps_per_cta)
        self._lock = threading.Lock()
        self._module = self._stream = None
        self._scratch = _Scratch(self.device)
        extra = tuple(options)
        if self.warps != WARPS_PER_CTA:
            extra += (f"-DECC_WARPS={self.warps}",)
        self.capability = cudadrv.compute_capability(self.device)
        with cudadrv.context(self.device):
            image, self.compiled_from_cache, self.cache_path, self.arch = load_or_compile(
                self.capability, self.cache_dir, extra)
            try:
                self._module = cudadrv.module_load_data(image)
            except cudadrv.CudaError as exc:
                if not self.compiled_from_cache:
                    raise
                log.warning("cached ECC kernels %s failed to load (%s): recompiling",
                            self.cache_path, exc)
                image, self.compiled_from_cache, self.cache_path, self.arch = load_or_compile(
                    self.capability, self.cache_dir, extra, skip_cache=True)
                self._module = cudadrv.module_load_data(image)
            try:
                fn = lambda name: cudadrv.module_function(self._module, name)  # noqa: E731
                self._encode = fn("ecc_encode")
                self._verify = fn("ecc_verify")
                self._repair = fn("ecc_repair")
                self._scan = fn("ecc_scan")
                cudadrv.function_max_dynamic_shared(self._repair, BLOCK)
                self._stream = cudadrv.stream_create()
            except BaseException:
                self.close()
                raise

    # ---- the codec ------------------------------------------------------------------------
    def encode(self, data_ptr: int, parity_ptr: int, cks_ptr: int, n: int) -> None:
        if self._check(data_ptr, parity_ptr, cks_ptr, n):
            with self._lock, cudadrv.context(self.device):
                self._launch_pass(self._encode, data_ptr, parity_ptr, cks_ptr, n, None)
                cudadrv.stream_synchronize(self._stream)

    def verify(self, data_ptr: int, parity_ptr: int, cks_ptr: int, n: int) -> np.ndarray:
        """Per block: 0 clean (parity consistent and checksum matches), 1 damaged."""
        return self._status_pass(self._verify, data_ptr, parity_ptr, cks_ptr, n)

    def repair(self, data_ptr: int, parity_ptr: int, cks_ptr: int,
               n: int) -> tuple[np.ndarray, np.ndarray]:
        """In place: (status CLEAN / CORRECTED / UNCORRECTABLE, symbols corrected) per block.
        Only blocks that verify as damaged are decoded; an UNCORRECTABLE block is unchanged."""
        status = np.zeros(n, np.uint8)
        corrected = np.zeros(n, np.int64)
        if not self._check(data_ptr, parity_ptr, cks_ptr, n):
            return status, corrected
        with self._lock, cudadrv.context(self.device):
            damaged = np.flatnonzero(self._run_status(self._verify, data_ptr, parity_ptr,
                                                      cks_ptr, n))
            k = len(damaged)
            if not k:
                return status, corrected
            list_off = 0
            fixed_off = _align(4 * k)
            st_off = fixed_off + _align(4 * k)
            sc = self._scratch
            sc.ensure(st_off + k)
            sc.array(list_off, k, np.uint32)[:] = damaged
            cudadrv.memcpy_htod_async(sc.dptr + list_off, sc.pinned.ptr + list_off, 4 * k,
                                      self._stream)
            cudadrv.launch_kernel(self._repair, k, REPAIR_THREADS,
                                  [_c64(data_ptr), _c64(parity_ptr), _c64(cks_ptr),
                                   _c64(sc.dptr + list_off), _c64(sc.dptr + st_off),
                                   _c64(sc.dptr + fixed_off)],
                                  self._stream, shared=BLOCK)
            cudadrv.memcpy_dtoh_async(sc.pinned.ptr + fixed_off, sc.dptr + fixed_off,
                                      st_off + k - fixed_off, self._stream)
            cudadrv.stream_synchronize(self._stream)
            status[damaged] = sc.array(st_off, k, np.uint8)
            corrected[damaged] = sc.array(fixed_off, k, np.uint32)
        return status, corrected

    def scan(self, ptr: int, nbytes: int) -> None:
        """Read nbytes (a multiple of 16) of device memory and nothing else: the read
        bandwidth yardstick the benchmark sets the codec beside."""
        if nbytes % 16 or ptr % 16:
            raise ValueError("scan: pointer and size must be multiples of 16")
        with self._lock, cudadrv.context(self.device):
            self._scratch.ensure(256)
            sms = cudadrv.attribute(self.device, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
            cudadrv.launch_kernel(self._scan, sms * 8, 256,
                                  [_c64(ptr), _c64(nbytes // 16), _c64(self._scratch.dptr)],
                                  self._stream)
            cudadrv.stream_synchronize(self._stream)

    # ---- plumbing -------------------------------------------------------------------------
    @staticmethod
    def _check(data_ptr: int, parity_ptr: int, cks_ptr: int, n: int) -> bool:
        if n < 0:
            raise ValueError(f"block count {n} < 0")
        if data_ptr % 16 or parity_ptr % 16 or cks_ptr % 8:
            raise ValueError("ECC buffers must be aligned: data and parity to 16 bytes, "
                             "checksums to 8")
        return n > 0

    def _launch_pass(self, fn, data_ptr, parity_ptr, cks_ptr, n, status_ptr) -> None:
        per_cta = self.warps       # one warp per block
        grid = (n + per_cta - 1) // per_cta
        args = [_c64(data_ptr), _c64(parity_ptr), _c64(cks_ptr)]
        if status_ptr is not None:
            args.append(_c64(status_ptr))
        args.append(_c64(n))
        cudadrv.launch_kernel(fn, grid, 32 * per_cta, args, self._stream)

    def _run_status(self, fn, data_ptr, parity_ptr, cks_ptr, n) -> np.ndarray:
        """Launch a status-writing pass and return the statuses (a copy). Lock and context
        held by the caller."""
        sc = self._scratch
        sc.ensure(n)
        self._launch_pass(fn, data_ptr, parity_ptr, cks_ptr, n, sc.dptr)
        cudadrv.memcpy_dtoh_async(sc.pinned.ptr, sc.dptr, n, self._stream)
        cudadrv.stream_synchronize(self._stream)
        return sc.array(0, n, np.uint8).copy()

    def _status_pass(self, fn, data_ptr, parity_ptr, cks_ptr, n) -> np.ndarray:
        if not self._check(data_ptr, parity_ptr, cks_ptr, n):
            return np.zeros(0, np.uint8)
        with self._lock, cudadrv.context(self.device):
            return self._run_status(fn, data_ptr, parity_ptr, cks_ptr, n)

    def close(self) -> None:
        with self._lock, cudadrv.context(self.device):
            if self._stream is not None:
                cudadrv.stream_synchronize(self._stream)
                cudadrv.stream_destroy(self._stream)
                self._stream = None
            self._scratch.free()
            if self._module is not None:
                cudadrv.module_unload(self._module)
                self._module = None

    def __enter__(self) -> GpuCodec:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = [
    "BLOCK", "CHECKSUM_BYTES", "CLEAN", "CORRECTED", "DAMAGED", "PARITY_BLOCK", "UNCORRECTABLE",
    "GpuCodec", "cache_name", "default_cache_dir", "load_or_compile", "prebuild", "read_source",
]
