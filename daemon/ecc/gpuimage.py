"""The compiled image of the GPU codec's kernels (kernels.cu beside this file): compiled with
NVRTC for a device's architecture (a cubin for sm_XY, or PTX for the newest architecture
NVRTC knows when it does not know the device's) and cached on disk, checked before use
(gpumemctl/cudadrv/kcache.py). daemon/ecc/gpu.py's GpuCodec loads it.

Apart from the codec, and free of numpy, so that gpumemd's start-up can prebuild the image
on a thread without importing the codec: numpy alone took 47-70 ms of a cuda daemon's
start, which adoption after a kill -9 waited for (bench/gpu.py, 100 durable allocations:
the adoption phase 60 -> 144 ms on an H100)."""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time

from gpumemctl import cudadrv
from gpumemctl.cudadrv import kcache

log = logging.getLogger("daemon.ecc.gpu")

KERNELS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cu")
BASE_OPTIONS = ("-std=c++17",)
_building = threading.Lock()       # load_or_compile: one compile at a time


def default_cache_dir() -> str:
    from gpumemctl.protocol import default_state_dir
    return os.path.join(default_state_dir(), "ecc-cache")


def read_source() -> bytes:
    with open(KERNELS_PATH, "rb") as f:
        return f.read()


def cache_key(source: bytes, options) -> str:
    h = hashlib.sha256(source)
    for o in options:
        h.update(b"\0" + o.encode())
    return h.hexdigest()


def target(capability: tuple[int, int]) -> tuple[str, bool]:
    """('sm_90', True) - a cubin for the device - or ('compute_NN', False): PTX for the newest
    architecture NVRTC knows, when it does not know the device's (the driver JIT-compiles it)."""
    return cudadrv.nvrtc_target(capability[0] * 10 + capability[1],
                                cudadrv.nvrtc_supported_archs())


def _options(arch: str, extra_options) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}", *BASE_OPTIONS, *extra_options)


def cache_name(source: bytes, arch: str, cubin: bool, extra_options=()) -> tuple[str, str]:
    """(the cache file's name, its key) for kernels.cu compiled for `arch`."""
    key = cache_key(source, _options(arch, extra_options))
    return f"ecc-{arch}-{key}.{'cubin' if cubin else 'ptx'}", key


def cache_path(cache_dir: str, source: bytes, arch: str, cubin: bool, extra_options=()) -> str:
    return os.path.join(cache_dir, cache_name(source, arch, cubin, extra_options)[0])


def load_or_compile(capability: tuple[int, int], cache_dir: str | None, extra_options=(), *,
                    skip_cache: bool = False) -> tuple[bytes, bool, str | None, str]:
    """(image, from_cache, cache path or None, arch) of kernels.cu for a device of this
    compute capability. A cached cubin for the device's own sm_XY is used without asking
    NVRTC anything (a daemon with a warm cache needs no libnvrtc). What is cached is
    checked before it is used (gpumemctl/cudadrv/kcache.py): a cache directory or file another
    user could write is not used, a file that does not match its SHA-256 is compiled again."""
    # One at a time in a process: a first use that comes while the prebuild compiles waits
    # for it and then loads what it cached, rather than compiling the same kernels beside it.
    with _building:
        started = time.monotonic()
        cache = kcache.KernelCache(cache_dir) if cache_dir else None
        try:
            out = _load_or_compile(read_source(), capability, cache, extra_options, skip_cache)
        finally:
            if cache is not None:
                cache.close()
    log.log(logging.DEBUG if out[1] else logging.INFO, "ECC kernels for %s %s in %.3f s",
            out[3], "loaded from the cache" if out[1] else "compiled", time.monotonic() - started)
    return out


def prebuild(indices, cache_dir: str | None) -> threading.Thread:
    """Compile the kernels for each device of `indices` into the cache, on a thread of its
    own, where they are not there yet. gpumemd starts it at start-up: the codec is made on
    its first use, on the event loop, and compiling there (about 0.5 s with NVRTC) held
    every client and made the first `gpumemctl load --ecc rs` after a start that much
    slower; from the cache the codec loads in milliseconds. Nothing is loaded here; a first
    use while it runs waits for it (load_or_compile), then loads from the cache."""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir    # as GpuCodec's

    def build() -> None:
        for capability in {cudadrv.compute_capability(i) for i in indices}:
            try:
                load_or_compile(capability, cache_dir)
            except Exception as exc:  # noqa: BLE001 - the first use says why, and falls back
                log.debug("ECC kernels not prebuilt for %s: %s", capability, exc)
    thread = threading.Thread(target=build, name="gpumemd-ecc-prebuild", daemon=True)
    thread.start()
    return thread


def _load_or_compile(source: bytes, capability: tuple[int, int], cache: kcache.KernelCache | None,
                     extra_options, skip_cache: bool) -> tuple[bytes, bool, str | None, str]:
    use = cache is not None and cache.usable and not skip_cache
    arch, cubin = f"sm_{capability[0]}{capability[1]}", True
    if use and cache is not None:
        name, key = cache_name(source, arch, cubin, extra_options)
        image = cache.load(name, key, arch)
        if image is not None:
            return image, True, os.path.join(cache.path, name), arch
    arch, cubin = target(capability)
    name, key = cache_name(source, arch, cubin, extra_options)
    path = os.path.join(cache.path, name) if cache is not None else None
    if use and cache is not None and not cubin:
        image = cache.load(name, key, arch)
        if image is not None:
            return image, True, path, arch
    image, compile_log = cudadrv.nvrtc_compile(source, "kernels.cu",
                                               _options(arch, extra_options), cubin=cubin)
    if compile_log:
        log.debug("NVRTC log for kernels.cu (%s): %s", arch, compile_log)
    if cache is not None:
        cache.store(name, image, key, arch, compiler=_compiler())
    return image, False, path, arch


def _compiler() -> str:
    """NVRTC's version, recorded in the cache file's header (it is loaded: it just compiled)."""
    try:
        major, minor = cudadrv.nvrtc_version()
    except cudadrv.CudaError:
        return "nvrtc"
    return f"nvrtc {major}.{minor}"
