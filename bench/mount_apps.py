#!/usr/bin/env python3
"""What programs do on the mount (issue 29): `ls -l` of a large directory, SQLite
transactions, and a read right after a write through the page cache, against tmpfs in the
same run.

    python3 bench/mount_apps.py                 # table on stdout
    python3 bench/mount_apps.py --files 10000 --inserts 10000
    python3 bench/mount_apps.py --json          # {"rows", "figures"}

It starts its own `gpumemd --backend B --mount DIR` (bench/fs.py's MountDaemon) in a fresh
/tmp/gpumemctl-appbench-* directory, and its tmpfs baseline in a fresh
/dev/shm/gpumemctl-appbench-* directory; both go at the end, also on an error or Ctrl-C.
Progress goes to stderr; only the table (or the JSON) to stdout. GPUMEMD_FUSE_INIT in the
environment reaches the daemon (docs/mount.md, "Init flags"): run it twice to compare flags.

Rows (the median of --runs runs each; mount and tmpfs alternate):
  1. `ls -l` (the real command, output to /dev/null) of a directory of --files empty files,
     right after a listing (the kernel's attributes fresh) and after sleeping past the
     mount's attribute timeout (every attribute fetched again);
  2. SQLite: --inserts single-row INSERTs, each its own transaction, in rollback-journal
     mode (journal_mode=DELETE, synchronous=FULL: a journal made, written, fsynced and
     removed per transaction), into a new database;
  3. a 256 MiB file written in 1 MiB pwrite()s through a read-write descriptor, then read
     back in 1 MiB reads (the pages the write left in the page cache, or the daemon's).
"""
from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
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
MiB = 1 << 20
TARGETS = {"ls_cold": 3.0, "sqlite": 5.0}      # issue 29: mount seconds / tmpfs seconds


def make_files(top: str, n: int) -> None:
    os.mkdir(top)
    for i in range(n):
        os.close(os.open(os.path.join(top, f"f{i:06d}"), os.O_CREAT | os.O_WRONLY, 0o644))


def ls_l(top: str, n: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(["ls", "-l", top], check=True, capture_output=True).stdout
    seconds = time.perf_counter() - t0
    lines = out.count(b"\n") - 1              # the "total" line, then one per file
    if lines != n:
        raise RuntimeError(f"ls -l {top}: {lines} lines, expected {n}")
    return seconds


def sqlite_inserts(path: str, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("pragma journal_mode=delete")
        db.execute("pragma synchronous=full")
        db.execute("create table t (k integer primary key, v text)")
        row = "x" * 100
        t0 = time.perf_counter()
        for i in range(n):
            db.execute("insert into t values (?, ?)", (i, row))
        seconds = time.perf_counter() - t0
        if db.execute("select count(*) from t").fetchone()[0] != n:
            raise RuntimeError(f"{path}: not {n} rows after the inserts")
    finally:
        db.close()
    return seconds


def write_then_read(path: str, size: int) -> tuple[float, float]:
    """GB/s of the 1 MiB pwrites through a read-write descriptor, and of the reads after."""
    block = os.urandom(MiB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for at in range(0, size, MiB):
            os.pwrite(fd, block, at)
        t1 = time.perf_counter()
        for at in range(0, size, MiB):
            if os.pread(fd, MiB, at) != block:
                raise RuntimeError(f"{path}: other bytes read back at {at}")
        t2 = time.perf_counter()
    finally:
        os.close(fd)
    os.unlink(path)
    return size / (t1 - t0) / 1e9, size / (t2 - t1) / 1e9


def one_run(base: str, r: int, args) -> dict:
    top = os.path.join(base, f"ls{r}")
    make_files(top, args.files)
    ls_l(top, args.files)                       # the first listing fills the caches
    out = {"ls_warm": ls_l(top, args.files)}
    time.sleep(ENTRY_TIMEOUT + 0.5)
    out["ls_cold"] = ls_l(top, args.files)
    out["sqlite"] = sqlite_inserts(os.path.join(base, f"db{r}.sqlite"), args.inserts)
    out["write_gbps"], out["read_gbps"] = write_then_read(os.path.join(base, f"big{r}"),
                                                          args.size)
    return out


def measure(where: dict, args) -> dict:
    per: dict = {w: [] for w in where}
    for r in range(args.runs):
        for w, base in where.items():
            say(f"{w}: run {r + 1}/{args.runs}")
            per[w].append(one_run(base, r, args))
    return {w: {k: statistics.median(x[k] for x in runs) for k in runs[0]} | {"runs": runs}
            for w, runs in per.items()}


ROWS = (("ls_warm", "ls -l of {files} files, attributes fresh (s)", False),
        ("ls_cold", "ls -l of {files} files, after the attribute timeout (s)", False),
        ("sqlite", "SQLite: {inserts} INSERT transactions, rollback journal (s)", False),
        ("write_gbps", "write 256 MiB, 1 MiB pwrite, O_RDWR (GB/s)", True),
        ("read_gbps", "read it right back, 1 MiB pread (GB/s)", True))


def rows_from(fig: dict) -> list[dict]:
    rows = []
    m, t, c = fig["results"]["mount"], fig["results"]["tmpfs"], fig["config"]
    for key, what, rate in ROWS:
        ratio = m[key] / t[key]
        target = TARGETS.get(key)
        rows.append({"row": what.format(**c), "mount": f"{m[key]:.3f}",
                     "tmpfs": f"{t[key]:.3f}",
                     "ratio": f"{ratio:.2f}x" + (" of tmpfs" if rate else " tmpfs's time"),
                     "target": f"<= {target:g}x" if target else "",
                     "met": ("yes" if ratio <= target else "no") if target else ""})
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    c = fig["config"]
    print(fs.machine_line(fig, f"backend {c['backend']}; "
                               f"GPUMEMD_FUSE_INIT={c['init'] or '(unset)'}"))
    print(f"median of {c['runs']} run(s); SQLite {sqlite3.sqlite_version}")
    print()
    print("\n".join(core.markdown_table(rows, list(rows[0]))))
    print()
    print(f"wall {fig['wall_s']:.1f} s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="auto", choices=("auto", "host", "cuda"))
    p.add_argument("--files", type=int, default=10000, help="files listed by ls -l (10000)")
    p.add_argument("--inserts", type=int, default=2000, help="SQLite transactions (2000)")
    p.add_argument("--size", type=int, default=256 * MiB, help="bytes written and read back")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--host-capacity", default="2G", help="passed to gpumemd (host backend)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (gpumemd.log)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = fs.pick_backend(args.backend)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-appbench-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-appbench-", dir="/dev/shm")
    d = fs.MountDaemon(base, backend, args.host_capacity if backend == "host" else None)
    fig: dict = {"machine": fs.machine(backend), "base_dir": base,
                 "config": {"backend": backend, "files": args.files, "inserts": args.inserts,
                            "size": args.size, "runs": args.runs,
                            "init": os.environ.get("GPUMEMD_FUSE_INIT", "")},
                 "loadavg": [round(os.getloadavg()[0], 2)]}

    def body() -> None:
        fig["results"] = measure({"mount": d.mnt, "tmpfs": shm}, args)

    stopped = fs.serve_and_measure(d, fig, shm, base, args.keep, body)
    if stopped is not None:
        return stopped
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
