#!/usr/bin/env python3
"""WRITE requests on gpumemd's mount by its two paths, in the same run: the init-flags
library's direct call of the daemon's handler with a view of libfuse's buffer (the default),
and pyfuse3's (GPUMEMD_FUSE_WRITES=pyfuse3: a bytes copy of each request and a coroutine),
against tmpfs.

    python3 bench/write_paths.py                          # host backend, ecc of the config
    python3 bench/write_paths.py --backend cuda --ecc none --size 1G --runs 5

Two gpumemd, one per path, each with its own mount, in fresh /tmp/gpumemctl-writepaths-*
directories (removed at the end, also on an error or Ctrl-C); tmpfs is a fresh
/dev/shm/gpumemctl-writepaths-* directory. A --size file of random bytes is made there once.
Each run, for each block size, each place in turn (the order rotating with the run) gets
`dd` of it to a new file with bs=BS (dd opens it write-only: direct I/O on the mount, one
WRITE per block), then the untimed open+close that waits for the release (bench/fs.py's
settle) and the file's removal; then each place gets 4096 pwrites of 4 KiB in order through
a read-write descriptor (the page cache, written through: one small WRITE each; writes/s).
Before each turn the script waits until both daemons have used no CPU for 0.1 s. GB/s from
dd's own seconds, the median of --runs. The first run's files are checked against the
source's sha256. At the end each daemon's log says how many WRITEs its library passed to
it directly: the table shows it, so a path that did not take effect is seen.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import core  # noqa: E402  bench/core.py: helpers
import floor_bulk  # noqa: E402  bench/floor_bulk.py: quiet()
import fs  # noqa: E402  bench/fs.py: the mount daemon, dd, the machine line

say = core.say
PATHS = ("direct", "pyfuse3")
BLOCK_SIZES = ("1M", "128K")
SMALL, SMALL_COUNT = 4096, 4096          # the small-write row: 16 MiB in 4 KiB pwrites


def start_daemons(base: str, backend: str, ecc: str | None, host_capacity: str) -> dict:
    daemons = {}
    for path in PATHS:
        d = fs.MountDaemon(os.path.join(base, path), backend,
                           host_capacity if backend == "host" else None)
        os.makedirs(d.base)
        d.extra_env = {"GPUMEMD_FUSE_WRITES": path}
        if ecc:
            config = os.path.join(d.base, "gpumemd.toml")
            with open(config, "w") as f:
                f.write(f'ecc = "{ecc}"\n')
            d.extra_args += ["--config", config]
        say(f"starting gpumemd ({path} WRITEs) --backend {backend} --mount {d.mnt}")
        daemons[path] = d
        d.start()
    return daemons


def one_run(where: dict, daemons: dict, r: int, src: str, src_hash: str, size: int) -> dict:
    order = list(where)[r % len(where):] + list(where)[:r % len(where)]
    secs: dict = {w: {} for w in where}
    for bs in BLOCK_SIZES:
        for w in order:
            for d in daemons.values():
                floor_bulk.quiet(d.proc.pid)
            dst = os.path.join(where[w], f"w{r}-{bs}")
            result = fs.run_dd(src, dst, bs)
            fs.settle(dst)
            if result["bytes"] != size:
                raise RuntimeError(f"dd to {dst}: {result['bytes']} of {size} bytes")
            if r == 0:
                fs.verify(dst, size, src_hash)
            os.unlink(dst)
            secs[w][bs] = result["dd_s"]
    for w in order:
        for d in daemons.values():
            floor_bulk.quiet(d.proc.pid)
        secs[w]["4K"] = small_writes(os.path.join(where[w], f"s{r}"))
    return secs


def small_writes(path: str) -> float:
    """Seconds for SMALL_COUNT pwrites of SMALL bytes, in order, through a read-write
    descriptor (the page cache, written through: one WRITE each), then close; the file is
    checked and removed."""
    block = os.urandom(SMALL)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for i in range(SMALL_COUNT):
            os.pwrite(fd, block, i * SMALL)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    if os.stat(path).st_size != SMALL * SMALL_COUNT:
        raise RuntimeError(f"{path}: size {os.stat(path).st_size} after the small writes")
    with open(path, "rb") as f:
        if f.read(SMALL) != block:
            raise RuntimeError(f"{path}: the first block reads back wrong")
    os.unlink(path)
    return seconds


def served(d) -> int | None:
    found = re.search(r"passed (\d+) WRITEs", d.log_tail(1 << 20))
    return int(found.group(1)) if found else None


def rows_from(fig: dict) -> list[dict]:
    size, secs, rows = fig["config"]["size"], fig["seconds"], []
    for key in BLOCK_SIZES:
        tmpfs = secs["tmpfs"][key]
        row = {"row": f"dd write {fs.format_size(size)} bs={key}, new file",
               "tmpfs (GB/s)": f"{fs.gbps(size, tmpfs):.2f}"}
        for path in PATHS:
            s = secs[path][key]
            row[f"{path} (GB/s)"] = f"{fs.gbps(size, s):.2f} ({tmpfs / s:.2f}x)"
        row["direct / pyfuse3"] = f"{secs['pyfuse3'][key] / secs['direct'][key]:.2f}x"
        rows.append(row)
    tmpfs = secs["tmpfs"]["4K"]
    row = {"row": f"{SMALL_COUNT} pwrites of 4K, O_RDWR (writes/s)",
           "tmpfs (GB/s)": f"{SMALL_COUNT / tmpfs:,.0f}"}
    for path in PATHS:
        s = secs[path]["4K"]
        row[f"{path} (GB/s)"] = f"{SMALL_COUNT / s:,.0f} ({tmpfs / s:.2f}x)"
    row["direct / pyfuse3"] = f"{secs['pyfuse3']['4K'] / secs['direct']['4K']:.2f}x"
    return rows + [row]


def print_table(fig: dict, rows: list[dict]) -> None:
    c = fig["config"]
    print(fs.machine_line(fig, f"gpumemd --backend {c['backend']}, ecc "
                               f"{c['ecc'] or 'of the default config'}"))
    print(f"median of {c['runs']} run(s); ratios in brackets are to tmpfs (above 1.00x: "
          f"faster than tmpfs)")
    print()
    print("\n".join(core.markdown_table(rows, list(rows[0]))))
    print()
    print("WRITEs passed directly, from each daemon's log at its stop: " + ", ".join(
        f"{p} {fig['served'][p]}" for p in PATHS))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="host", choices=("host", "cuda", "auto"))
    p.add_argument("--ecc", default=None, choices=("rs", "none"),
                   help="the daemons' default ecc (their built-in default: rs)")
    p.add_argument("--size", default=None, help="bytes written per dd (256M; 1G on cuda)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--host-capacity", default="2G")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = fs.pick_backend(args.backend)
    size = fs.parse_size(args.size or floor_bulk.default_size(backend))
    fs.check_shm(2 * size)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-writepaths-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-writepaths-", dir="/dev/shm")
    fig: dict = {"machine": fs.machine(backend),
                 "config": {"backend": backend, "ecc": args.ecc, "size": size,
                            "runs": args.runs},
                 "loadavg": [round(os.getloadavg()[0], 2)]}
    daemons: dict = {}
    try:
        daemons = start_daemons(base, backend, args.ecc, args.host_capacity)
        where = {"tmpfs": shm, **{p: d.mnt for p, d in daemons.items()}}
        src = os.path.join(shm, "src")
        src_hash = fs.make_source(src, size)
        runs = []
        for r in range(args.runs):
            say(f"run {r + 1}/{args.runs}")
            runs.append(one_run({w: p for w, p in where.items()}, daemons, r, src, src_hash,
                                size))
        fig["seconds"] = {w: {key: statistics.median(x[w][key] for x in runs)
                              for key in runs[0][w]} for w in where}
        fig["runs"] = runs
        fig["loadavg"].append(round(os.getloadavg()[0], 2))
    except KeyboardInterrupt:
        return 130
    except Exception:
        for d in daemons.values():
            core.show_log_tail(d)
        raise
    finally:
        fig["stop"] = {p: d.stop_and_clean() for p, d in daemons.items()}
        fig["served"] = {p: served(d) for p, d in daemons.items()}
        shutil.rmtree(shm, ignore_errors=True)
        if all(s.get("unmounted_by") != "STILL MOUNTED" for s in fig["stop"].values()):
            shutil.rmtree(base, ignore_errors=True)
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
