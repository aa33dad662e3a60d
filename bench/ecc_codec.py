"""ECC codec throughput (bench/ecc_codec.py): the CUDA codec on the GPU beside the device's own read
bandwidth measured in the same run, and the numpy codec on the CPU. Prints a table.

    python3 bench/ecc_codec.py [--size 8G] [--cpu-size 256M] [--json]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402

BLOCK = 128 * 1024


def timed(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def gpu_rows(size: int) -> list[tuple[str, float, str]]:
    import cupy as cp

    from daemon.ecc.cuda_codec import GpuCodec
    from gpumemctl import cudadrv
    cudadrv.make_current(0)
    codec = GpuCodec(0, None)
    n = size // BLOCK
    d = cp.random.randint(0, 256, size, dtype=cp.uint8)
    p, c = cp.zeros(n * 8192, cp.uint8), cp.zeros(n * 8, cp.uint8)
    cp.cuda.Device().synchronize()      # the codec's stream does not wait for CuPy's
    args = (d.data.ptr, p.data.ptr, c.data.ptr, n)
    words = d.view(cp.uint32)

    def read():
        words.sum(dtype=cp.uint32)
        cp.cuda.Device().synchronize()
    base = size / timed(read) / 1e12
    rows = [("device read (cupy sum)", base, "baseline")]
    for name, fn in (("encode", codec.encode), ("verify", codec.verify)):
        tput = size / timed(lambda: fn(*args)) / 1e12
        rows.append((f"GPU {name}", tput, f"{tput / base:.2f}x of read"))
    flips = cp.random.randint(0, size, 64)
    d[flips] ^= 1
    cp.cuda.Device().synchronize()
    tput = size / timed(lambda: codec.repair(*args), reps=1) / 1e12
    rows.append(("GPU repair (64 damaged blocks)", tput, f"{tput / base:.2f}x of read"))
    return rows


def cpu_rows(size: int) -> list[tuple[str, float, str]]:
    from daemon.ecc import cpu
    n = size // BLOCK
    d = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    p, c = np.zeros(n * 8192, np.uint8), np.zeros(n * 8, np.uint8)
    memcpy = size / timed(lambda: d.copy()) / 1e9
    rows = [("CPU memcpy (numpy copy)", memcpy * 1000, "baseline")]
    for name, fn in (("encode", cpu.encode), ("verify", cpu.verify)):
        mbs = size / timed(lambda: fn(d, p, c), reps=2) / 1e6
        rows.append((f"CPU {name}", mbs, f"{mbs / (memcpy * 1000):.3f}x of memcpy"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="8G")
    ap.add_argument("--cpu-size", default="256M")
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args()
    print(f"| what | throughput | vs baseline |\n| --- | --- | --- |")
    if not args.no_gpu:
        size = parse_size(args.size)
        for what, tput, note in gpu_rows(size):
            print(f"| {what}, {format_size(size)} | {tput:.3f} TB/s | {note} |")
    size = parse_size(args.cpu_size)
    for what, tput, note in cpu_rows(size):
        print(f"| {what}, {format_size(size)} | {tput:.0f} MB/s | {note} |")
    print("targets (H100): verify >= 2.0 TB/s, encode >= 1.0 TB/s; CPU codec >= 100 MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
