#!/usr/bin/env python3
"""What growing a large allocation costs, by extents and by a copy (issue 26, item 1).

    python3 bench/extents.py --backend cuda [--size 4G] [--json]

It starts gpumemd twice on the cuda backend with a mount, once with `--extents on` and once
with `--extents off`. Each time it creates a durable allocation of --size with ECC, fills it,
and grows it to twice --size by truncating its file on the mount (as `truncate -s` would),
then shrinks it back. It reports the seconds of each step and whether the
bytes are unchanged after. The yardstick, in the same run: the copy a growth without
extents makes (device to device).

A last step in each mode: an allocation of 60% of the device's free memory grown by a
quarter, which a copy cannot do (it needs the old and the new memory at once).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: small helpers

from gpumemctl.protocol import GpumemError, format_size, parse_size  # noqa: E402

PIECE = 64 << 20


def fill(c, name: str, size: int) -> str:
    digest = hashlib.sha256()
    with c.open(name, "rw") as h:
        piece = os.urandom(PIECE)
        for off in range(0, size, PIECE):
            data = piece[:min(PIECE, size - off)]
            h.write(data, off)
            digest.update(data)
    return digest.hexdigest()


def head_digest(c, name: str, size: int) -> str:
    digest = hashlib.sha256()
    with c.open(name, "r") as h:
        for off in range(0, size, PIECE):
            digest.update(h.read(off, min(PIECE, size - off)))
    return digest.hexdigest()


def timed_truncate(path: str, size: int) -> float:
    t = time.perf_counter()
    os.truncate(path, size)
    return time.perf_counter() - t


def run_mode(mode: str, size: int) -> dict:
    base = tempfile.mkdtemp(prefix="gpumemctl-extbench-", dir="/tmp")
    d = core.Daemon(base, backend="cuda", mount=True, extra_args=["--extents", mode])
    row: dict = {"extents": mode, "size": size}
    try:
        d.start()
        path = os.path.join(d.mnt, "big")
        with d.connect() as c:
            c.create("big", size, durable=True, ecc="rs")
            want = fill(c, "big", size)
            row["grow_s"] = timed_truncate(path, 2 * size)
            row["layout"] = c.info("big").get("extents")
            row["shrink_s"] = timed_truncate(path, size)
            row["bytes_kept"] = head_digest(c, "big", size) == want
            c.remove("big")
            row["near_full"] = near_full(c, path)
    finally:
        d.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    return row


def near_full(c, path: str) -> dict:
    """Most of the free memory in one allocation, grown by a quarter of it."""
    free = min(dev["free"] for dev in c.status()["devices"])
    size = int(free * 0.6) // (2 << 20) * (2 << 20)
    c.create("big", size, ecc="none")
    grown = size + size // 4
    out = {"size": size, "grown": grown, "free_before": free}
    t = time.perf_counter()
    try:
        os.truncate(path, grown)
        out["result"] = "grown"
    except OSError as exc:
        out["result"] = f"refused: {exc}"
    out["seconds"] = time.perf_counter() - t
    out["layout"] = c.info("big").get("extents")
    c.remove("big")
    return out


def copy_yardstick(size: int) -> float:
    """GB/s of one device-to-device copy of `size` bytes (what a growth without extents
    makes), through the driver directly."""
    from gpumemctl import cudadrv
    cudadrv.init()
    gran = cudadrv.granularity(0)
    cap = -(-size // gran) * gran
    a, b = (cudadrv.Mapping(cudadrv.mem_create(cap, 0), cap, 0, writable=True)
            for _ in range(2))
    try:
        with cudadrv.context(0):
            cudadrv.memcpy_dtod(b.ptr, a.ptr, size)
            cudadrv.ctx_synchronize()
            t = time.perf_counter()
            cudadrv.memcpy_dtod(b.ptr, a.ptr, size)
            cudadrv.ctx_synchronize()
            seconds = time.perf_counter() - t
    finally:
        a.close()
        b.close()
    return size / seconds / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="4G")
    p.add_argument("--backend", choices=("cuda",), default="cuda")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    size = parse_size(args.size)
    fig: dict = {"machine": core.machine(), "rows": [run_mode(m, size) for m in ("on", "off")]}
    try:
        fig["dtod_gbps"] = copy_yardstick(size)
    except (GpumemError, Exception) as exc:  # noqa: BLE001 - the table says so
        fig["dtod_gbps"] = None
        fig["dtod_error"] = str(exc)
    if args.json:
        print(json.dumps(fig, indent=2))
        return 0
    print(f"gpumemctl extents benchmark (issue 26) - {fig['machine'].get('gpu') or 'GPU'}; "
          f"a durable allocation of {format_size(size)} with ECC grown to twice that and "
          f"shrunk back through the mount")
    print(f"{'extents':8} {'grow s':>8} {'shrink s':>9} {'bytes kept':>10}  "
          "layout after growth")
    for r in fig["rows"]:
        print(f"{r['extents']:8} {r['grow_s']:8.3f} {r['shrink_s']:9.3f} "
              f"{r['bytes_kept']!s:>10}  {r['layout']}")
    if fig["dtod_gbps"]:
        print(f"yardstick: one device-to-device copy of {format_size(size)}: "
              f"{fig['dtod_gbps']:.1f} GB/s ({size / fig['dtod_gbps'] / 1e9:.3f} s)")
    for r in fig["rows"]:
        near = r["near_full"]
        print(f"near full, extents {r['extents']}: {format_size(near['size'])} "
              f"(of {format_size(near['free_before'])} free) grown to "
              f"{format_size(near['grown'])}: {near['result']} in {near['seconds']:.3f} s, "
              f"layout {near['layout']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
