#!/usr/bin/env python3
"""What a small write into a large allocation costs (issue 26, the parity of what changed).

    python3 bench/partial_write.py [--writes 20] [--large 1G] [--json]

It starts its own gpumemd (host backend, or --backend cuda) from this checkout in a temp dir,
makes a 4 MiB and a --large allocation with ECC (rs) and one of --large without (none), fills
each once, then times --writes writes of 4 KiB at random offsets into each, two ways: by a
descriptor (`Client.open` + `Handle.write` + close: the close encodes the parity of what the
handle declares it wrote) and by copy (`Client.write_many`: the daemon writes and encodes the
blocks written). The figure the issue sets: the 4 KiB write into the large allocation within
2x of one into 4 MiB. Before issue 26 a writer's close re-encoded the whole allocation:
4.7 s for 4 KiB into 1 GiB on the host backend against 0.07 s without ECC.
"""
from __future__ import annotations

import argparse
import json
import os
import random
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

from gpumemctl.protocol import format_size, parse_size  # noqa: E402

SMALL = 4 << 20
WRITE = 4096
FILL = 64 << 20


def fill(c, name: str, size: int) -> None:
    with c.open(name, "rw") as h:
        piece = os.urandom(min(FILL, size))
        for off in range(0, size, len(piece)):
            h.write(piece[:min(len(piece), size - off)], off)


def time_writes(c, name: str, size: int, writes: int, how: str, rng: random.Random
                ) -> list[float]:
    out = []
    for _ in range(writes):
        off = rng.randrange(0, size - WRITE) // WRITE * WRITE
        data = os.urandom(WRITE)
        t = time.perf_counter()
        if how == "fd":
            with c.open(name, "rw") as h:
                h.write(data, off)
        else:
            c.write_many([{"path": name, "data": data, "offset": off}], raise_errors=True)
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=20)
    p.add_argument("--large", default="1G")
    p.add_argument("--backend", choices=("host", "cuda"), default="host")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    large = parse_size(args.large)
    base = tempfile.mkdtemp(prefix="gpumemctl-pwbench-", dir="/tmp")
    extra = ["--host-capacity", str(4 * large)] if args.backend == "host" else []
    d = core.Daemon(base, backend=args.backend, extra_args=extra)
    rng = random.Random(26)
    fig: dict = {"machine": core.machine(), "writes": args.writes, "large": large,
                 "backend": args.backend, "rows": []}
    try:
        d.start()
        with d.connect() as c:
            cases = [("small-rs", SMALL, "rs"), ("large-rs", large, "rs"),
                     ("large-none", large, "none")]
            for name, size, ecc in cases:
                c.create(name, size, ecc=ecc)
                fill(c, name, size)
            for how in ("fd", "copy"):
                for name, size, ecc in cases:
                    times = time_writes(c, name, size, args.writes, how, rng)
                    fig["rows"].append({"how": how, "allocation": name, "size": size,
                                        "ecc": ecc, "median_s": statistics.median(times),
                                        "max_s": max(times)})
        verify = d.cli("verify", "--all", check=0).returncode
        fig["verify_exit"] = verify
    finally:
        d.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(fig, indent=2))
        return 0
    m = fig["machine"]
    print(f"gpumemctl partial-write benchmark (issue 26) - {m['nproc']} CPU(s), "
          f"{m['cpu_model']}, backend {args.backend}; {args.writes} writes of 4 KiB each; "
          f"verify --all after: exit {fig['verify_exit']}")
    print(f"{'how':6} {'allocation':12} {'size':>8} {'ecc':5} {'median ms':>10} {'max ms':>8}"
          f" {'vs 4 MiB rs':>12}")
    for how in ("fd", "copy"):
        rows = [r for r in fig["rows"] if r["how"] == how]
        small = rows[0]["median_s"]
        for r in rows:
            print(f"{how:6} {r['allocation']:12} {format_size(r['size']):>8} "
                  f"{r['ecc']:5} {r['median_s'] * 1e3:10.2f} {r['max_s'] * 1e3:8.2f} "
                  f"{r['median_s'] / small:11.2f}x")
    print("target: 4 KiB into the large allocation (rs) within 2x of into 4 MiB (rs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
