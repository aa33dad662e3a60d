#!/usr/bin/env python3
"""ECC codec benchmarks: the CUDA codec (daemon/ecc/gpu.py) beside the device's read bandwidth
measured in the same run, and the numpy codec (daemon/ecc/cpu.py). Run on the GPU machine:

    source .gpu/env.sh; python3 bench/ecc.py        # table on stdout, progress on stderr
    python3 bench/ecc.py --json                     # the same figures as one JSON document
    python3 bench/ecc.py --size 2                   # GiB of data on the GPU (default 8)
    python3 bench/ecc.py --variant="-DECC_PREFETCH=4 -DECC_MIN_CTAS=3"   # tuning rows (note the =)

Rows (TB/s are 10^12 bytes of *data* per second; parity and checksums come on top):
  read scan     a kernel that only reads the same buffer (16-byte loads, XOR): the yardstick.
  encode        parity + checksums of every block (writes n*8 KiB + n*8 bytes).
  verify        parity recomputed and compared, checksums compared: one status byte per block.
  repair        on clean data (= a verify), then with a 4096-byte burst in 1 of every 64 blocks
                (each repair call re-damages the same bytes first; only the call is timed).
  CPU codec     encode and verify of --cpu-size MiB of random data in this process (numpy).
Each GPU figure is the median of --reps calls, each call synchronised and its statuses copied
to the host, as the daemon would see it. The buffers are CuPy arrays; the codec gets their
device pointers. Exit status 0 when the run completed (--strict: 1 when a target is missed).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: small helpers

MiB, GiB = 1 << 20, 1 << 30
BLOCK, PARITY_BLOCK, CKS = 131072, 8192, 8
TARGETS = {"verify": 2.0, "encode": 1.0, "cpu": 100.0}   # TB/s, TB/s, MB/s
say = core.say


def tbps(nbytes: int, seconds: float) -> float:
    return core.gbps(nbytes, seconds) / 1000.0


def timed(fn, reps: int, warm: int = 1, before=None) -> list[float]:
    for _ in range(warm):
        if before:
            before()
        fn()
    out = []
    for _ in range(reps):
        if before:
            before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def fill_kernel(cp):
    return cp.ElementwiseKernel(
        "uint64 seed", "uint32 w",
        """unsigned long long x = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ull;
           x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
           x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
           w = (unsigned int)(x ^ (x >> 31));""",
        "ecc_bench_fill")


def split_variant(text: str) -> tuple[tuple[str, ...], int | None]:
    opts, warps = [], None
    for o in text.split():
        if o.startswith("-DECC_WARPS="):
            warps = int(o.split("=", 1)[1])
        else:
            opts.append(o)
    return tuple(opts), warps


# ---- GPU ----------------------------------------------------------------------------------------
def phase_gpu(args) -> dict:
    import cupy as cp

    from daemon.ecc.gpu import GpuCodec
    from gpumemctl import cudadrv

    size = int(args.size * GiB) // BLOCK * BLOCK
    n = size // BLOCK
    fig = {"size": size, "blocks": n}
    cache = tempfile.mkdtemp(prefix="gpumemctl-eccbench-")
    try:
        with cp.cuda.Device(args.device):
            say(f"allocating {size / GiB:.1f} GiB of data + parity on device {args.device}")
            data = cp.empty(size, cp.uint8)
            parity = cp.zeros(n * PARITY_BLOCK, cp.uint8)
            cks = cp.zeros(n * CKS, cp.uint8)
            fill = fill_kernel(cp)
            words = data.view(cp.uint32)
            step = 256 * MiB // 4
            for k in range(0, len(words), step):
                fill(cp.uint64(12345 + k), words[k:k + step])
            cp.cuda.Device(args.device).synchronize()
            ptrs = (data.data.ptr, parity.data.ptr, cks.data.ptr, n)

            say("compiling the kernels (NVRTC), then loading them from the cache")
            t = time.perf_counter()
            codec = GpuCodec(args.device, cache)
            fig["compile_s"] = time.perf_counter() - t
            t = time.perf_counter()
            GpuCodec(args.device, cache).close()
            fig["cached_load_s"] = time.perf_counter() - t
            fig["arch"] = codec.arch
            try:
                fig.update(measure(cp, codec, data, ptrs, args))
            finally:
                codec.close()
            fig["variants"] = []
            for text in args.variant:
                opts, warps = split_variant(text)
                say(f"variant {text!r}")
                kw = {"warps_per_cta": warps} if warps else {}
                with GpuCodec(args.device, cache, options=opts, **kw) as v:
                    enc = timed(lambda: v.encode(*ptrs), args.reps)
                    ver = timed(lambda: v.verify(*ptrs), args.reps)
                    if v.verify(*ptrs).any():
                        raise RuntimeError(f"variant {text!r}: verify disagrees with encode")
                fig["variants"].append({"options": text,
                                        "encode_tbps": tbps(size, statistics.median(enc)),
                                        "verify_tbps": tbps(size, statistics.median(ver))})
            del data, parity, cks
            cp.get_default_memory_pool().free_all_blocks()
        fig["gpu"] = {"index": args.device, "name": cudadrv.device_name(args.device),
                      "capability": ".".join(map(str, cudadrv.compute_capability(args.device))),
                      "driver": ".".join(map(str, cudadrv.driver_version()))}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return fig


def measure(cp, codec, data, ptrs, args) -> dict:
    size, n, reps = len(data), ptrs[3], args.reps
    med = statistics.median
    out = {}
    say("read scan (yardstick)")
    out["read_tbps"] = tbps(size, med(timed(lambda: codec.scan(ptrs[0], size), reps, warm=2)))
    say("encode")
    out["encode_tbps"] = tbps(size, med(timed(lambda: codec.encode(*ptrs), reps)))
    say("verify")
    if codec.verify(*ptrs).any():
        raise RuntimeError("verify reports damage right after encode")
    out["verify_tbps"] = tbps(size, med(timed(lambda: codec.verify(*ptrs), reps)))
    say("repair (clean)")
    out["repair_clean_tbps"] = tbps(size, med(timed(lambda: codec.repair(*ptrs), reps)))

    every, off = 64, 5000
    blocks = data.reshape(n, BLOCK)
    damaged = len(range(0, n, every))

    def damage():
        blocks[::every, off:off + 4096] ^= cp.uint8(0x5A)
        cp.cuda.Device(args.device).synchronize()

    results = []

    def repair():
        results.append(codec.repair(*ptrs))

    say(f"repair ({damaged} blocks with a 4096-byte burst)")
    times = timed(repair, reps, before=damage)
    for status, fixed in results:
        if int((status == 1).sum()) != damaged or int(fixed.sum()) != damaged * 4096 or \
                int(status.sum()) != damaged:
            raise RuntimeError("repair of the bursts did not report every block CORRECTED")
    if codec.verify(*ptrs).any():
        raise RuntimeError("data still damaged after repair")
    out["repair_damaged_tbps"] = tbps(size, med(times))
    out["repair_damaged_blocks"] = damaged
    return out


# ---- CPU ----------------------------------------------------------------------------------------
def phase_cpu(size_mib: int) -> dict | None:
    if importlib.util.find_spec("daemon.ecc.cpu") is None:
        say("daemon/ecc/cpu.py is not there: no CPU rows")
        return None
    import numpy as np

    from daemon.ecc import cpu
    n = size_mib * MiB // BLOCK
    say(f"CPU codec on {size_mib} MiB")
    data = np.random.default_rng(1).integers(0, 256, n * BLOCK, dtype=np.uint8)
    parity = np.empty(n * PARITY_BLOCK, np.uint8)
    cks = np.empty(n * CKS, np.uint8)
    enc = min(timed(lambda: cpu.encode(data, parity, cks), 2, warm=0))
    ver = min(timed(lambda: cpu.verify(data, parity, cks), 2, warm=0))
    return {"size": n * BLOCK, "encode_mbps": n * BLOCK / enc / 1e6,
            "verify_mbps": n * BLOCK / ver / 1e6}


# ---- report -------------------------------------------------------------------------------------
def rows_from(fig: dict) -> list[dict]:
    g, c = fig["gpu_fig"], fig.get("cpu")
    read = g["read_tbps"]

    def ok(value, target):
        return "yes" if value >= target else "NO"

    def row(what, value, target=None):
        return {"what": what, "measured": f"{value:.2f} TB/s", "of_read": f"{value / read:.0%}",
                "target": f">= {target:.1f} TB/s" if target else "",
                "ok": ok(value, target) if target else ""}

    size = f"{g['size'] / GiB:.0f} GiB"
    rows = [
        {"what": f"read scan of {size} (device read bandwidth)", "measured": f"{read:.2f} TB/s",
         "of_read": "100%", "target": "yardstick", "ok": ""},
        row(f"encode {size}", g["encode_tbps"], TARGETS["encode"]),
        row(f"verify {size}", g["verify_tbps"], TARGETS["verify"]),
        row(f"repair {size} (clean: one verify)", g["repair_clean_tbps"]),
        row(f"repair {size} ({g['repair_damaged_blocks']} blocks with a 4 KiB burst)",
            g["repair_damaged_tbps"]),
        {"what": f"compile kernels.cu (NVRTC, {g['arch']}) + load", "of_read": "",
         "measured": f"{g['compile_s']:.2f} s", "target": "", "ok": ""},
        {"what": "construct from the cache", "measured": f"{g['cached_load_s'] * 1e3:.0f} ms",
         "of_read": "", "target": "", "ok": ""},
    ]
    for v in g.get("variants", []):
        rows.append(row(f"  variant {v['options']}: encode", v["encode_tbps"]))
        rows.append(row(f"  variant {v['options']}: verify", v["verify_tbps"]))
    if c:
        for op in ("encode", "verify"):
            value = c[f"{op}_mbps"]
            rows.append({"what": f"CPU codec {op} {c['size'] >> 20} MiB (numpy)",
                         "measured": f"{value:.0f} MB/s", "of_read": "",
                         "target": f">= {TARGETS['cpu']:.0f} MB/s",
                         "ok": ok(value, TARGETS["cpu"])})
    else:
        rows.append({"what": "CPU codec (daemon/ecc/cpu.py)", "measured": "absent",
                     "of_read": "", "target": "", "ok": ""})
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    g = fig["gpu_fig"]["gpu"]
    print(f"gpumemctl ECC benchmark - device {g['index']} {g['name']} (sm {g['capability']}), "
          f"CUDA driver {g['driver']}, {core.machine()['nproc']} CPUs; "
          f"total run {fig['wall_s']:.1f} s")
    headers = ["what", "measured", "of read", "target", "ok?"]
    keys = ["what", "measured", "of_read", "target", "ok"]
    widths = [max(len(h), *(len(str(r[k])) for r in rows))
              for h, k in zip(headers, keys, strict=True)]
    cells = (h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print("  ".join(cells))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join([r["what"].ljust(widths[0]), r["measured"].rjust(widths[1]),
                         r["of_read"].rjust(widths[2]), r["target"].ljust(widths[3]),
                         r["ok"]]).rstrip())
    print(f"targets: verify >= {TARGETS['verify']} TB/s and encode >= {TARGETS['encode']} TB/s "
          f"of data on an H100 (read bound ~3.1 TB/s, docs/ecc.md); CPU codec >= "
          f"{TARGETS['cpu']:.0f} MB/s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--size", type=float, default=8, help="GiB of data on the GPU")
    p.add_argument("--reps", type=int, default=5, help="timed calls per row (median)")
    p.add_argument("--cpu-size", type=int, default=256, help="MiB for the CPU codec rows")
    p.add_argument("--variant", action="append", default=[],
                   help="NVRTC options for a tuning row: --variant='-DECC_PREFETCH=4'")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    fig = {"gpu_fig": phase_gpu(args)}
    fig["cpu"] = phase_cpu(args.cpu_size) if args.cpu_size else None
    fig["wall_s"] = time.perf_counter() - t0
    rows = rows_from(fig)
    core.emit(fig, rows, args.json, print_table)
    missed = any(r["ok"] == "NO" for r in rows)
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
