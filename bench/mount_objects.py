#!/usr/bin/env python3
"""Many small files in the mount (issue 26): creates, stats and unlinks per second, against
tmpfs in the same run.

    python3 bench/mount_objects.py                  # table on stdout
    python3 bench/mount_objects.py --files 20000 --runs 3
    python3 bench/mount_objects.py --json           # {"rows", "figures"}

It starts its own `gpumemd --backend B --mount DIR` (bench/fs.py's MountDaemon, over
bench/core.py's harness) in a fresh /tmp/gpumemctl-mobench-* directory, and its tmpfs
baseline in a fresh /dev/shm/gpumemctl-mobench-* directory; both go at the end, also on an
error, Ctrl-C or SIGTERM (gpumemd stopped, the mount checked gone, the keeper killed).
Progress goes to stderr; only the table (or the JSON) to stdout. What each row means:
bench/README.md, "bench/mount_objects.py".

Per run, in a new directory of the mount and one of tmpfs (alternating: mount, tmpfs, mount,
...), with --files N names spread over directories of --per-dir:
  1. create: open(O_CREAT|O_WRONLY|O_TRUNC, 0644), write --size bytes (4 KiB), close;
  2. stat: os.stat of each (the kernel's attribute cache answers most of them);
  3. stat after the cache expired: the same, after sleeping past the mount's entry timeout
     (with --cold; the mount's requests then reach gpumemd);
  4. unlink: os.unlink of each, then the directories are removed.
The rates are files over the loop's own time; the table shows the median of --runs runs.
"""
from __future__ import annotations

import argparse
import os
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
import fs  # noqa: E402  bench/fs.py: the mount daemon, the machine header

from daemon.fs.attrs import ENTRY_TIMEOUT  # noqa: E402

say = core.say
# Issue 26's mount targets (set for the GPU machine) and the peer's figures there.
TARGETS = {"create": 5000, "unlink": 5000}
PEERS = {"create": 10673, "unlink": 26012}          # vramfs on the H200 machine
FLAGS = os.O_CREAT | os.O_WRONLY | os.O_TRUNC


def create_write(path: str, data: bytes) -> None:
    fd = os.open(path, FLAGS, 0o644)
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)


def timed(fn, items, *extra) -> float:
    t0 = time.perf_counter()
    for item in items:
        fn(item, *extra)
    return time.perf_counter() - t0


def one_run(top: str, n: int, per_dir: int, data: bytes, cold: bool) -> dict:
    """Rates (files/s) of each phase in a new directory `top`."""
    os.mkdir(top)
    dirs = [os.path.join(top, f"d{i:04d}") for i in range((n + per_dir - 1) // per_dir)]
    for d in dirs:
        os.mkdir(d)
    paths = [os.path.join(dirs[i // per_dir], f"f{i:06d}") for i in range(n)]
    secs = {"create": timed(create_write, paths, data)}
    listed = sum(len(os.listdir(d)) for d in dirs)
    if listed != n:
        raise RuntimeError(f"{top}: {listed} entries after creating {n}")
    secs["stat"] = timed(os.stat, paths)
    sizes = {os.stat(p).st_size for p in paths[:: max(1, n // 100)]}
    if sizes != {len(data)}:
        raise RuntimeError(f"{top}: sizes {sorted(sizes)} after writing {len(data)} bytes")
    if cold:
        time.sleep(ENTRY_TIMEOUT + 0.5)
        secs["stat_cold"] = timed(os.stat, paths)
    secs["unlink"] = timed(os.unlink, paths)
    for d in dirs:
        os.rmdir(d)
    os.rmdir(top)
    return {op: n / s for op, s in secs.items()}


def measure(where: dict, args, data: bytes) -> dict:
    per: dict = {w: [] for w in where}
    for r in range(-args.warmup, args.runs):
        for w, base in where.items():
            label = "warm-up" if r < 0 else f"run {r + 1}/{args.runs}"
            say(f"{w}: {args.files} files of {len(data)} B, {label}")
            result = one_run(os.path.join(base, f"run{r + args.warmup}"), args.files,
                             args.per_dir, data, args.cold)
            if r >= 0:
                per[w].append(result)
    return {w: {op: statistics.median(x[op] for x in runs) for op in runs[0]} | {"runs": runs}
            for w, runs in per.items()}


ROWS = (("create", "creates/s (open O_CREAT|O_WRONLY, write, close)"),
        ("stat", "stats/s, right after the creates"),
        ("stat_cold", "stats/s, entry cache expired"),
        ("unlink", "unlinks/s"))


def rows_from(fig: dict) -> list[dict]:
    rows = []
    for key, what in ROWS:
        if key not in fig["rates"]["mount"]:
            continue
        m, t = fig["rates"]["mount"][key], fig["rates"]["tmpfs"][key]
        target = TARGETS.get(key)
        rows.append({"row": what, "mount": f"{m:,.0f}", "tmpfs": f"{t:,.0f}",
                     "ratio": f"{m / t:.3f}x",
                     "target": f">= {target:,}/s" if target else "",
                     "met": ("yes" if m >= target else "no") if target else "",
                     "vramfs (H200)": f"{PEERS[key]:,}" if key in PEERS else ""})
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    c = fig["config"]
    print(fs.machine_line(fig, f"backend {c['backend']}"))
    print(f"{c['files']} files of {c['size']} B in directories of {c['per_dir']}, median of "
          f"{c['runs']} run(s) after {c['warmup']} warm-up; ratio = mount / tmpfs")
    print()
    print("\n".join(core.markdown_table(rows, list(rows[0]))))
    print()
    print(f"wall {fig['wall_s']:.1f} s; targets are issue 26's for the GPU machine "
          "(indicative elsewhere); vramfs figures measured on the H200 machine")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="host", choices=("auto", "host", "cuda"))
    p.add_argument("--files", type=int, default=10000, help="files per run (10000)")
    p.add_argument("--size", type=int, default=4096, help="bytes written per file (4096)")
    p.add_argument("--per-dir", type=int, default=1000, help="files per directory (1000)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cold", action="store_true",
                   help=f"also stat after the entry cache expired ({ENTRY_TIMEOUT} s)")
    p.add_argument("--host-capacity", default=None, help="passed to gpumemd")
    p.add_argument("--extra", action="append", default=[],
                   help="one more gpumemd argument (repeatable), e.g. --extra=--ecc=none")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (gpumemd.log)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = fs.pick_backend(args.backend)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-mobench-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-mobench-", dir="/dev/shm")
    d = fs.MountDaemon(base, backend, args.host_capacity)
    d.extra_args += args.extra
    fig: dict = {"machine": fs.machine(backend), "base_dir": base,
                 "config": {"backend": backend, "files": args.files, "size": args.size,
                            "per_dir": args.per_dir, "runs": args.runs,
                            "warmup": args.warmup, "extra": args.extra},
                 "loadavg": [round(os.getloadavg()[0], 2)]}

    def body() -> None:
        data = os.urandom(args.size)
        fig["rates"] = measure({"mount": d.mnt, "tmpfs": shm}, args, data)

    stopped = fs.serve_and_measure(d, fig, shm, base, args.keep, body)
    if stopped is not None:
        return stopped
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
