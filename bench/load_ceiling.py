#!/usr/bin/env python3
"""What bounds `gpumemctl load` from the page cache (issue 29): the parts of its copy, each
alone, on the GPU machine, against the pinned copy rate in the same run.

    source .gpu/env.sh; python3 bench/load_ceiling.py               # GPU machine, 16 GiB
    python3 bench/load_ceiling.py --size 4G --json

It writes --size random bytes into a fresh /dev/shm/gpumemctl-ceiling-* directory (the page
cache) and removes it at the end, also on an error or Ctrl-C. No daemon: the copies run in
this process, into device memory of its own (cuMemAlloc). Progress on stderr, the table on
stdout. GB/s = 10^9 bytes/s; each row is the best of --runs.

  1. The yardstick: cuMemcpyHtoDAsync of 256 MiB pieces from one pinned buffer, the whole
     --size (bench/gpu.py's row, over the same bytes as the others).
  2. The reads alone: the file into pinned buffers (`preadv` of 8 MiB pieces) by 4, 8, 16
     and 24 threads, nothing copied to the device: what the host gives.
  3. Reads and copies together, as the load runs them: gpumemctl's own pipeline
     (cudadrv.Stager.upload_pieces with gpumemctl/memory.py's PIPELINE_* shape and I/O
     pool), into the device.
  4. No host copy at all: the file's mapping page-locked a window at a time
     (cuMemHostRegister READ_ONLY) and copied to the device from the page cache itself, for
     256 MiB and 1 GiB windows; the seconds spent page-locking beside it.
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: small helpers

from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402

say = core.say
PIECE = 8 << 20
STEP = 256 << 20


def make_source(path: str, size: int) -> None:
    say(f"writing {format_size(size)} of random data to {path}")
    block = os.urandom(64 << 20)
    with open(path, "wb") as f:
        for at in range(0, size, len(block)):
            f.write(block[:min(len(block), size - at)])


def best(fn, runs: int) -> float:
    return max(fn() for _ in range(runs))


def pinned_copy(cu, dptr: int, size: int) -> float:
    buf = cu.PinnedBuffer(STEP, 0)
    streams = [cu.stream_create() for _ in range(2)]
    try:
        t = time.perf_counter()
        for i, at in enumerate(range(0, size, STEP)):
            cu.memcpy_htod_async(dptr + at, buf.ptr, min(STEP, size - at), streams[i % 2])
        cu.ctx_synchronize()
        return size / (time.perf_counter() - t) / 1e9
    finally:
        for s in streams:
            cu.stream_destroy(s)
        buf.free()


def reads_alone(cu, fd: int, size: int, threads: int) -> float:
    """The file into a ring of 6 pinned 32 MiB buffers, PIECE at a time, by `threads`."""
    chunk = 32 << 20
    bufs = [cu.PinnedBuffer(chunk, 0) for _ in range(6)]
    try:
        with ThreadPoolExecutor(threads) as pool:
            t = time.perf_counter()
            futures: list = []
            for k, at in enumerate(range(0, size, chunk)):
                view = bufs[k % len(bufs)].view[:min(chunk, size - at)]
                futures += [pool.submit(os.preadv, fd, [view[o:o + PIECE]], at + o)
                            for o in range(0, len(view), PIECE)]
                if len(futures) > 4 * threads:      # a bounded queue, as the load keeps
                    for f in futures[:-2 * threads]:
                        f.result()
                    futures = futures[-2 * threads:]
            for f in futures:
                f.result()
            return size / (time.perf_counter() - t) / 1e9
    finally:
        for b in bufs:
            b.free()


def as_load_runs(cu, fd: int, dptr: int, size: int) -> float:
    from gpumemctl import memory
    pool = memory._io_pool()
    stager = cu.Stager(0, memory.PIPELINE_CHUNK, memory.PIPELINE_DEPTH)

    def read(view: memoryview, at: int) -> list:
        return [pool.submit(memory._pread_full, fd, view[o:o + memory.PIPELINE_PIECE], at + o)
                for o in range(0, len(view), memory.PIPELINE_PIECE)]
    try:
        t = time.perf_counter()
        stager.upload_pieces(dptr, size, read)
        return size / (time.perf_counter() - t) / 1e9
    finally:
        stager.close()


def from_page_cache(cu, fd: int, dptr: int, size: int, window: int) -> tuple[float, float]:
    """(GB/s, seconds page-locking) of copies straight from the file's mapping."""
    from gpumemctl.cudadrv.driver import _cu, _driver
    flags = _driver().CU_MEMHOSTREGISTER_READ_ONLY | _driver().CU_MEMHOSTREGISTER_PORTABLE
    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    import numpy as np
    base = np.frombuffer(m, np.uint8).ctypes.data    # a read-only mapping's address
    stream = cu.stream_create()
    locked: list[int] = []
    pinning = 0.0
    try:
        t = time.perf_counter()
        for at in range(0, size, window):
            n = min(window, size - at)
            t1 = time.perf_counter()
            _cu("cuMemHostRegister", base + at, n, flags)
            pinning += time.perf_counter() - t1
            locked.append(base + at)
            cu.memcpy_htod_async(dptr + at, base + at, n, stream)
            if len(locked) > 2:                  # two windows in flight, then let one go
                cu.stream_synchronize(stream)
                for p in locked[:-1]:
                    _cu("cuMemHostUnregister", p)
                locked = locked[-1:]
        cu.stream_synchronize(stream)
        return size / (time.perf_counter() - t) / 1e9, pinning
    finally:
        cu.stream_synchronize(stream)
        for p in locked:
            _cu("cuMemHostUnregister", p)
        cu.stream_destroy(stream)
        m.close()


def measure(path: str, size: int, runs: int) -> dict:
    from gpumemctl import cudadrv as cu
    cu.make_current(0)
    fig: dict = {"device": cu.device_name(0), "size": size, "runs": runs}
    dptr = cu.mem_alloc(size)
    fd = os.open(path, os.O_RDONLY)
    try:
        say("the pinned copy")
        fig["pinned"] = best(lambda: pinned_copy(cu, dptr, size), runs)
        fig["reads"] = {}
        for threads in (4, 8, 16, 24):
            say(f"reads alone, {threads} threads")
            fig["reads"][threads] = best(lambda t=threads: reads_alone(cu, fd, size, t), runs)
        say("reads and copies, as the load runs them")
        fig["as_load"] = best(lambda: as_load_runs(cu, fd, dptr, size), runs)
        fig["page_cache"] = {}
        for window in (256 << 20, 1 << 30):
            say(f"copies from the page cache, {format_size(window)} windows")
            results = [from_page_cache(cu, fd, dptr, size, window) for _ in range(runs)]
            fig["page_cache"][window] = max(results)
    finally:
        os.close(fd)
        cu.mem_free(dptr)
    return fig


def rows_from(fig: dict) -> list[dict]:
    pin = fig["pinned"]
    rows = [{"what": "pinned copy host->device, 256 MiB pieces", "GB/s": f"{pin:.1f}",
             "ratio": "yardstick"}]
    for threads, rate in fig["reads"].items():
        rows.append({"what": f"reads alone into pinned buffers, {threads} threads, 8 MiB "
                             "preadv", "GB/s": f"{rate:.1f}", "ratio": f"{rate / pin:.2f}x"})
    rows.append({"what": "reads and copies together, as `gpumemctl load` runs them",
                 "GB/s": f"{fig['as_load']:.1f}", "ratio": f"{fig['as_load'] / pin:.2f}x"})
    for window, (rate, pinning) in fig["page_cache"].items():
        rows.append({"what": f"copies from the page cache itself, {format_size(int(window))} "
                             f"windows page-locked ({pinning:.2f} s of it locking)",
                     "GB/s": f"{rate:.1f}", "ratio": f"{rate / pin:.2f}x"})
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    print(f"gpumemctl load ceiling - {fig['device']}, {os.cpu_count()} CPUs; "
          f"{format_size(fig['size'])} from /dev/shm; best of {fig['runs']}; GB/s = 10^9 B/s")
    for line in core.markdown_table(rows, ["what", "GB/s", "ratio"]):
        print(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="16G", help="bytes copied (default 16G)")
    p.add_argument("--runs", type=int, default=2, help="runs of each row (best)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    size = parse_size(args.size)
    shm = tempfile.mkdtemp(prefix="gpumemctl-ceiling-", dir="/dev/shm")
    try:
        path = os.path.join(shm, "source")
        make_source(path, size)
        fig = measure(path, size, args.runs)
    except KeyboardInterrupt:
        return 130
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
