#!/usr/bin/env python3
"""Filesystem benchmark of gpumemd's mount: dd throughput and metadata rates against tmpfs.

    python3 bench/fs.py                          # table on stdout
    python3 bench/fs.py --backend host --size 512M
    python3 bench/fs.py --json                   # the same as JSON

It starts its own `gpumemd --backend B --mount DIR` (the console script next to this
interpreter) in a fresh /tmp/gpumemctl-fsbench-* directory, and its source file and tmpfs
baseline in a fresh /dev/shm/gpumemctl-fsbench-* directory. At the end (also on an error or
Ctrl-C) the daemon gets SIGTERM, the mount is checked gone (`fusermount3 -u -z` if not), the
keeper is killed and both directories are removed. Progress goes to stderr; only the table
(or the JSON) goes to stdout. What each row means: bench/README.md.

  1. Sequential write and read with real `dd` (bs=1M and bs=128K): a random source file in
     /dev/shm -> a file on the mount, then that file -> /dev/null; the same with a file in
     /dev/shm as the baseline. GB/s from dd's own report (1 GB = 10^9 bytes, as dd prints),
     so the figures compare with published dd numbers. The file is removed between runs; the
     read-back is checked against the source's sha256 once per block size (not timed).
     At bs=128K the read is done once more after `echo 3 > /proc/sys/vm/drop_caches` (root):
     the mount's page cache is gone, so the kernel's readahead fetches it from gpumemd.
  2. mmap read of a cached file (--mmap-size, 1 GiB): the file is written and read once
     (untimed, it fills the page cache), then mapped shared read-only and copied out in
     1 MiB slices, a new mapping per run (so each run takes the page faults).
  3. Metadata: create (open O_CREAT|O_WRONLY + close) of N empty files, stat of each twice,
     unlink of each; on the mount and in a /dev/shm directory.
"""
from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: the daemon harness and small helpers

from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
BLOCK_SIZES = (("1M", MiB), ("128K", 128 << 10))
MOUNT_FS_TYPE = "fuse.gpumem"
say = core.say

# Published figures of the peer (vramfs, dd on the H100 machine).
PEERS = {"vramfs_write_gbps": 0.70, "vramfs_read_gbps": 2.2, "vramfs_creates_per_s": 13000,
         "tmpfs_write_gbps": (2.0, 2.3), "tmpfs_read_gbps": (6.2, 6.4)}
# Issue 15's targets, set for the H100 machine: ratios to tmpfs in the same run ("x"), or
# rates ("/s"). Row key -> (kind, threshold).
TARGETS = {"write 1M": ("x", 1.0), "read 1M": ("x", 1.0), "read 128K": ("x", 0.8),
           "mmap": ("x", 0.8), "create": ("/s", 5000), "unlink": ("/s", 5000)}


# ---- the machine --------------------------------------------------------------------------------
def nvidia_smi(*query: str) -> str | None:
    """nvidia-smi's output, or None when it is missing or fails."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        proc = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def pick_backend(choice: str) -> str:
    if choice != "auto":
        return choice
    return "cuda" if nvidia_smi("-L") else "host"


def machine(backend: str) -> dict:
    m = core.machine()
    gpus = nvidia_smi("--query-gpu=name", "--format=csv,noheader")
    return {"cpu_model": m["cpu_model"], "nproc": m["nproc"], "mem_gib": m["mem_gib"],
            "gpu": gpus.splitlines()[0].strip() if gpus else None,
            "gpu_count": len(gpus.splitlines()) if gpus else 0,
            "kernel": platform.release(), "backend": backend,
            "loadavg_at_start": m["loadavg_at_start"]}


def machine_line(fig: dict, settings: str) -> str:
    """The first line of a mount benchmark's table: the machine (fig["machine"], machine()),
    the benchmark's own `settings`, and the load average at its start and end."""
    m = fig["machine"]
    return (f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_gib']} GiB, "
            f"Linux {m['kernel']}, Python {platform.python_version()}, GPU {m['gpu'] or '-'}; "
            f"{settings}; load {fig['loadavg'][0]} at start, {fig['loadavg'][-1]} at end")


def mount_type(path: str) -> str | None:
    """The filesystem type mounted exactly at `path`, or None."""
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and fields[1].replace("\\040", " ") == path:
                return fields[2]
    return None


# ---- the daemon under test ----------------------------------------------------------------------
class MountDaemon(core.Daemon):
    """bench/core.py's harness, starting gpumemd with a backend and a mount at `mnt`."""

    def __init__(self, base: str, backend: str, host_capacity: str | None):
        super().__init__(base, backend=backend, mount=True,
                         extra_args=["--host-capacity", host_capacity] if host_capacity else [])

    def start(self) -> None:
        """Spawn, wait until the socket serves (the mount is up before that), check it."""
        super().start(timeout=30)
        kind = mount_type(self.mnt)
        if kind != MOUNT_FS_TYPE:
            raise RuntimeError(f"gpumemd serves but {self.mnt} is mounted as {kind!r}, "
                               f"expected {MOUNT_FS_TYPE}")

    def stop_and_clean(self) -> dict:
        """SIGTERM, wait, make sure the mount is gone, kill the keeper. Never raises."""
        result = {"exit": None, "stop_s": None, "unmounted_by": None}
        if self.proc is not None and self.proc.poll() is None:
            t0 = time.perf_counter()
            self.proc.send_signal(signal.SIGTERM)
            try:
                result["exit"] = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                result["exit"] = f"killed: no exit 30 s after SIGTERM (now {self.proc.wait()})"
            result["stop_s"] = time.perf_counter() - t0
        elif self.proc is not None:
            result["exit"] = self.proc.returncode
        if self.mounted():
            say(f"{self.mnt} is still mounted after gpumemd stopped; detaching it")
        result["unmounted_by"] = self.unmount()   # 'gpumemd' when it had gone already
        self.cleanup()                       # the keeper, and the daemon if still alive
        return result


# ---- 1. sequential I/O with dd ------------------------------------------------------------------
def make_source(path: str, size: int, chunk: int = 64 * MiB) -> str:
    """A file of `size` random bytes; returns its sha256."""
    say(f"writing {format_size(size)} of random data to {path}")
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(chunk, left))
            digest.update(block)
            f.write(block)
            left -= len(block)
    return digest.hexdigest()


file_sha256 = core.file_sha256


DD_SUMMARY = re.compile(r"^(\d+) bytes .*copied, ([0-9.e+-]+) s,", re.MULTILINE)


def run_dd(src: str, dst: str, bs: str, fsync: bool = False, count: int | None = None) -> dict:
    """One dd; bytes and seconds as dd reports them (open to close of both files), and the
    wall time of the process around it."""
    argv = ["dd", f"if={src}", f"of={dst}", f"bs={bs}"] + (["conv=fsync"] if fsync else []) + \
        ([f"count={count}"] if count is not None else [])
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "LC_ALL": "C"})
    wall = time.perf_counter() - t0
    found = DD_SUMMARY.search(proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return {"bytes": int(found.group(1)), "dd_s": float(found.group(2)), "wall_s": wall}


def settle(path: str) -> float:
    """open+close of the file just written. close(2) does not wait for FUSE's release (where
    gpumemd syncs and trims the written file); this request queues behind it, so the read
    that follows is not charged for it."""
    t0 = time.perf_counter()
    os.close(os.open(path, os.O_RDONLY))
    return time.perf_counter() - t0


def drop_caches() -> bool:
    """Empty the kernel's page cache (root only): False when it cannot."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def seq_once(src: str, dst: str, bs: str, size: int, fsync: bool, cold: bool) -> dict:
    """Write src -> dst, read dst -> /dev/null (and with `cold`, again after dropping the
    page cache), remove dst."""
    write = run_dd(src, dst, bs, fsync)
    write["settle_s"] = settle(dst)
    result = {"write": write, "read": run_dd(dst, "/dev/null", bs)}
    if cold and drop_caches():
        result["cold_read"] = run_dd(dst, "/dev/null", bs)
    for what, r in result.items():
        if r["bytes"] != size:
            raise RuntimeError(f"dd {what} bs={bs} {dst}: copied {r['bytes']} of {size} bytes")
    return result


def verify(dst: str, size: int, want: str) -> None:
    got_size = os.stat(dst).st_size
    if got_size != size:
        raise RuntimeError(f"{dst}: size {got_size} after the write, expected {size}")
    got = file_sha256(dst)
    if got != want:
        raise RuntimeError(f"{dst}: sha256 {got} of the read-back, source has {want}")


def run_name(n: int, runs: int) -> str:
    """Runs are numbered from -warmup; the negative ones are warm-ups (not counted)."""
    return "warm-up" if n < 0 else f"run {n + 1}/{runs}"


def phase_seq(dirs: dict, src: str, src_hash: str, size: int, warmup: int, runs: int,
              fsync: bool) -> dict:
    out = {}
    for label, _ in BLOCK_SIZES:
        per = {where: [] for where in dirs}
        for n in range(-warmup, runs):
            for where, d in dirs.items():
                say(f"dd bs={label} {where} {run_name(n, runs)}")
                dst = os.path.join(d, f"seq-{label}")
                result = seq_once(src, dst, label, size, fsync, cold=label == "128K")
                if n == -warmup:
                    say(f"checking the sha256 of {dst}")
                    verify(dst, size, src_hash)
                os.unlink(dst)
                if n >= 0:
                    per[where].append(result)
        out[label] = {where: seq_summary(results, size) for where, results in per.items()}
    return out


gbps = core.gbps


def seq_summary(results: list[dict], size: int) -> dict:
    """Median GB/s of the runs (dd's own timing), and every run's figures."""
    cold = [gbps(size, r["cold_read"]["dd_s"]) for r in results if "cold_read" in r]
    return {"write_gbps": statistics.median(gbps(size, r["write"]["dd_s"]) for r in results),
            "read_gbps": statistics.median(gbps(size, r["read"]["dd_s"]) for r in results),
            "cold_read_gbps": statistics.median(cold) if cold else None,
            "write_settle_s_max": max(r["write"]["settle_s"] for r in results),
            "runs": results}


# ---- 2. mmap read of a cached file ------------------------------------------------------------
def mmap_read_once(path: str, size: int, chunk: int = MiB) -> float:
    """Seconds to copy the whole file out of a new shared read-only mapping."""
    out = bytearray(chunk)
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            with memoryview(m) as view:
                for offset in range(0, size, chunk):
                    with view[offset:offset + chunk] as piece:
                        out[:len(piece)] = piece
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def phase_mmap(dirs: dict, src: str, size: int, warmup: int, runs: int) -> dict:
    """The file written with dd and read once (the page cache holds it), then timed."""
    per: dict = {where: [] for where in dirs}
    paths = {where: os.path.join(d, "mmap-cached") for where, d in dirs.items()}
    size = size // MiB * MiB
    for path in paths.values():
        run_dd(src, path, "1M", count=size // MiB)
        run_dd(path, "/dev/null", "1M")
    for n in range(-warmup, runs):
        for where, path in paths.items():
            say(f"mmap read of a cached {format_size(size)} file, {where} {run_name(n, runs)}")
            seconds = mmap_read_once(path, size)
            if n >= 0:
                per[where].append(seconds)
    for path in paths.values():
        os.unlink(path)
    return {where: {"gbps": statistics.median(gbps(size, s) for s in secs), "runs_s": secs}
            for where, secs in per.items()}


# ---- 3. metadata --------------------------------------------------------------------------------
def timed_loop(fn, items) -> float:
    t0 = time.perf_counter()
    for item in items:
        fn(item)
    return time.perf_counter() - t0


def create_empty(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def meta_once(directory: str, n: int) -> dict:
    """Rates (per second) of create, stat (twice) and unlink of n empty files."""
    os.mkdir(directory)
    paths = [os.path.join(directory, f"f{i:06d}") for i in range(n)]
    secs = {"create": timed_loop(create_empty, paths)}
    if len(os.listdir(directory)) != n:
        raise RuntimeError(f"{directory}: {len(os.listdir(directory))} entries after "
                           f"creating {n}")
    secs["stat_first"] = timed_loop(os.stat, paths)
    secs["stat_again"] = timed_loop(os.stat, paths)
    secs["unlink"] = timed_loop(os.unlink, paths)
    if os.listdir(directory):
        raise RuntimeError(f"{directory}: not empty after unlinking all {n} files")
    os.rmdir(directory)
    return {op: n / s for op, s in secs.items()}


def phase_meta(dirs: dict, n: int, warmup: int, runs: int) -> dict:
    per = {where: [] for where in dirs}
    for r in range(-warmup, runs):
        for where, d in dirs.items():
            say(f"metadata: {n} creates, 2x{n} stats, {n} unlinks on {where}, "
                f"{run_name(r, runs)}")
            result = meta_once(os.path.join(d, "meta"), n)
            if r >= 0:
                per[where].append(result)
    return {where: {op: statistics.median(x[op] for x in results) for op in results[0]}
            | {"runs": results} for where, results in per.items()}


# ---- report -------------------------------------------------------------------------------------
META_ROWS = (("create", "creates/s (open O_CREAT|O_WRONLY + close, empty)"),
             ("stat_first", "stats/s, right after the creates"),
             ("stat_again", "stats/s, second pass"),
             ("unlink", "unlinks/s"))


def target_cells(key: str | None, mount: float, tmpfs: float) -> dict:
    """The row's target (TARGETS) and whether this run met it."""
    if key is None or key not in TARGETS:
        return {"target": "", "met": ""}
    kind, threshold = TARGETS[key]
    value = mount / tmpfs if kind == "x" else mount
    label = f">= {threshold:.1f}x" if kind == "x" else f">= {threshold:,}/s"
    return {"target": label, "met": "met" if value >= threshold else "missed"}


def rows_from(fig: dict) -> list[dict]:
    rows = []

    def row(what, mount, tmpfs, fmt, key=None):
        rows.append({"what": what, "mount": fmt(mount), "tmpfs": fmt(tmpfs),
                     "ratio": f"{mount / tmpfs:.2f}x"} | target_cells(key, mount, tmpfs))

    def gb(v):
        return f"{v:.2f}"

    size, fsync = format_size(fig["config"]["size"]), fig["config"]["fsync"]
    for label, _ in BLOCK_SIZES:
        s = fig["seq"][label]
        conv = ", conv=fsync" if fsync else ""
        row(f"dd write {size} bs={label}{conv} (GB/s)", s["mount"]["write_gbps"],
            s["tmpfs"]["write_gbps"], gb, "write 1M" if label == "1M" else None)
        row(f"dd read {size} bs={label} -> /dev/null (GB/s)", s["mount"]["read_gbps"],
            s["tmpfs"]["read_gbps"], gb, f"read {label}")
        if s["mount"]["cold_read_gbps"] is not None:
            row(f"dd read {size} bs={label} after drop_caches (GB/s)",
                s["mount"]["cold_read_gbps"], s["tmpfs"]["cold_read_gbps"], gb)
    m = fig["mmap"]
    row(f"mmap read of a cached {format_size(fig['config']['mmap_size'])} file (GB/s)",
        m["mount"]["gbps"], m["tmpfs"]["gbps"], gb, "mmap")
    n = fig["config"]["files"]
    for op, what in META_ROWS:
        row(f"{what}, n={n}", fig["meta"]["mount"][op], fig["meta"]["tmpfs"][op],
            lambda v: f"{v:,.0f}", op)
    return rows


def header(fig: dict) -> list[str]:
    m, c = fig["machine"], fig["config"]
    gpu = f"{m['gpu']} (x{m['gpu_count']})" if m["gpu"] else "no GPU (nvidia-smi)"
    return [f"gpumemctl fs benchmark - {m['cpu_model']}, {m['nproc']} cores, "
            f"{m['mem_gib']} GiB RAM, {gpu}, Linux {m['kernel']}, "
            f"load average at start {m['loadavg_at_start'][0]}",
            f"gpumemd --backend {m['backend']} --mount; tmpfs = /dev/shm; size "
            f"{format_size(c['size'])}; median of {c['runs']} runs after {c['warmup']} "
            f"warm-up; sha256 of the read-back checked; total run {fig['wall_s']:.1f} s, "
            f"load average at the end {fig['loadavg_at_end']}"]


def footer(fig: dict, rows: list[dict]) -> list[str]:
    p = PEERS
    mount = fig["seq"]["1M"]["mount"]
    creates = fig["meta"]["mount"]["create"]
    on_h100 = "H100" in (fig["machine"]["gpu"] or "")
    where = "this run is on an H100" if on_h100 else "this run is not: indicative only"
    judged = [r for r in rows if r["target"]]
    missed = [r["what"] for r in judged if r["met"] == "missed"]
    stop = fig.get("stop", {})
    versus = "" if on_h100 else " (not the same machine)"
    return [
        f"peers (H100 machine, dd bs=1M): vramfs write {p['vramfs_write_gbps']:.2f} GB/s, "
        f"read {p['vramfs_read_gbps']} GB/s, {p['vramfs_creates_per_s']:,} creates/s; tmpfs "
        "there write %.1f-%.1f GB/s, read %.1f-%.1f GB/s" % (*p["tmpfs_write_gbps"],
                                                             *p["tmpfs_read_gbps"]),
        f"targets (issue 15, set for the H100 machine; {where}): "
        f"{len(judged) - len(missed)} of {len(judged)} met"
        + (f"; missed: {'; '.join(missed)}" if missed else ""),
        f"vs vramfs: write {mount['write_gbps'] / p['vramfs_write_gbps']:.2f}x, read "
        f"{mount['read_gbps'] / p['vramfs_read_gbps']:.2f}x, creates "
        f"{creates / p['vramfs_creates_per_s']:.2f}x{versus}",
        f"stop: SIGTERM -> exit {stop.get('exit')} in {stop.get('stop_s') or 0:.2f} s; "
        f"mount removed by {stop.get('unmounted_by')}"]


def serve_and_measure(d, fig: dict, shm: str, base: str, keep: bool, body) -> int | None:
    """A mount benchmark's frame: start `d`, run body() (it fills `fig`), then stop it and
    clean up whatever happened (finish). None when done, 130 when interrupted; on an error
    the daemon's log tail, then the error."""
    started = time.perf_counter()
    try:
        say(f"starting gpumemd --backend {d.backend} --mount {d.mnt}")
        d.start()
        body()
        fig["wall_s"] = time.perf_counter() - started
        fig["loadavg_at_end"] = round(os.getloadavg()[0], 2)
        fig.setdefault("loadavg", []).append(fig["loadavg_at_end"])
    except KeyboardInterrupt:
        say("interrupted; stopping gpumemd and removing the temp dirs")
        return 130
    except Exception:
        core.show_log_tail(d)
        raise
    finally:
        finish(d, fig, shm, base, keep)
    return None


def finish(d, fig: dict, shm: str, base: str, keep: bool) -> None:
    """A mount benchmark's end, also on an error: gpumemd stopped and its mount checked gone
    (fig["stop"]), the tmpfs directory removed, and the daemon's directory unless it is
    still mounted or `keep`."""
    fig["stop"] = d.stop_and_clean()
    shutil.rmtree(shm, ignore_errors=True)
    if fig["stop"]["unmounted_by"] == "STILL MOUNTED":
        say(f"{d.mnt} could not be unmounted; left {base} in place")
    elif keep:
        say(f"kept {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)


def print_table(fig: dict, rows: list[dict]) -> None:
    for line in header(fig):
        print(line)
    for line in core.markdown_table(rows, ["what", "mount", "tmpfs", "ratio", "target", "met"]):
        print(line)
    for line in footer(fig, rows):
        print(line)


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("auto", "host", "cuda"), default="auto",
                   help="gpumemd backend (auto: cuda if nvidia-smi works, else host)")
    p.add_argument("--size", default=None,
                   help="bytes per dd file (default 1G on host, 4G on cuda)")
    p.add_argument("--runs", type=int, default=3, help="runs of each measurement (median)")
    p.add_argument("--warmup", type=int, default=1,
                   help="uncounted runs before them (the first also checks the sha256)")
    p.add_argument("--files", type=int, default=5000, help="files in the metadata phase")
    p.add_argument("--mmap-size", default="1G", help="the cached file mapped (default 1G)")
    p.add_argument("--fsync", action="store_true", help="dd writes with conv=fsync")
    p.add_argument("--host-capacity", default=None, help="passed on to gpumemd")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (daemon log)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or args.files < 1:
        p.error("--runs and --files must be at least 1, --warmup at least 0")
    return args


def check_shm(size: int) -> None:
    free = shutil.disk_usage("/dev/shm").free
    if free < 2 * size + 64 * MiB:
        raise SystemExit(f"bench/fs.py: /dev/shm has {format_size(free)} free; the source and "
                         f"the tmpfs copy need {format_size(2 * size)} (use --size)")


def run_phases(d: MountDaemon, shm: str, fig: dict, args) -> None:
    """The phases, once gpumemd serves the mount, from a source file made in `shm`."""
    cfg = fig["config"]
    src = os.path.join(shm, "src")
    src_hash = make_source(src, cfg["size"])
    dirs = {"mount": d.mnt, "tmpfs": os.path.join(shm, "dst")}
    os.mkdir(dirs["tmpfs"])
    fig["seq"] = phase_seq(dirs, src, src_hash, cfg["size"], args.warmup, args.runs,
                           args.fsync)
    fig["mmap"] = phase_mmap(dirs, src, min(cfg["mmap_size"], cfg["size"]), args.warmup,
                             args.runs)
    os.unlink(src)
    fig["meta"] = phase_meta(dirs, args.files, args.warmup, args.runs)


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = pick_backend(args.backend)
    size = parse_size(args.size or ("4G" if backend == "cuda" else "1G"))
    check_shm(size)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-fsbench-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-fsbench-", dir="/dev/shm")
    d = MountDaemon(base, backend, args.host_capacity)
    fig: dict = {"machine": machine(backend), "base_dir": base,
                 "config": {"size": size, "mmap_size": min(parse_size(args.mmap_size), size),
                            "warmup": args.warmup, "runs": args.runs,
                            "files": args.files, "fsync": args.fsync}}
    stopped = serve_and_measure(d, fig, shm, base, args.keep,
                                lambda: run_phases(d, shm, fig, args))
    if stopped is not None:
        return stopped
    rows = rows_from(fig)
    core.emit(fig, rows, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
