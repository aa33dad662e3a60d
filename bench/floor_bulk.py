"""bench/mount_floor.py's bulk-data rows: bench/fs.py's `dd` rows on tmpfs, on the C floor
(bench/fuse_floor.c) and on gpumemd's mount, in the same run.

A --size file of random bytes is made once in the tmpfs directory (fs.make_source). Then, in
each run and for each block size (1M, then 128K), each place in turn (the order rotating
with the run as for the other rows) gets bench/fs.py's own measurement, fs.seq_once: `dd` of
the source to a new file there with bs=BS (dd opens it write-only: direct I/O on both FUSE
mounts, as gpumemd opens write-only by default), the untimed open+close that waits for the
write's release (fs.settle), and `dd` of the file to /dev/null with bs=BS right after
(through the page cache: the kernel's readahead asks in requests of up to 1 MiB, 4 MiB
ahead). GB/s from dd's own seconds (fs.run_dd). The file is removed after; on the first run
its read-back is checked against the source's sha256 (fs.verify, not timed).

The 128K write is there to give the 128K read a file whose pages nobody has cached yet, as
bench/fs.py's 128K row reads; it is shown too. The floor's requests are counted around each
fs.seq_once: its WRITEs belong to the write row and its READs to the read row. Before each
place's turn the script waits until gpumemd has used no CPU for 0.1 s (quiet()): it works
for a while after a file's release, and that must not land on the next place's dd. The
floor's file pages are made at its start (fuse_floor -P --size): it pays no page faults, as
tmpfs pays none (bench/fuse_floor.c, "file data").
"""
from __future__ import annotations

import os
import re
import statistics
import time

import core  # bench/core.py: helpers
import fs  # bench/fs.py: the dd measurement

say = core.say
MiB = fs.MiB
BLOCK_SIZES = ("1M", "128K")
# (key, row, the floor's opcode whose requests the row makes)
ROWS = tuple(row for bs in BLOCK_SIZES for row in (
    (f"write_{bs}", f"dd write {{size}} bs={bs}, new file", "WRITE"),
    (f"read_{bs}", f"dd read bs={bs} right after", "READ")))
QUIET_S = 0.1
LIMITS = ("max_write", "max_read", "max_readahead", "max_background", "congestion_threshold")


def default_size(backend: str) -> str:
    return "1G" if backend == "cuda" else "256M"


def cpu_ticks(pid: int) -> int | None:
    """A process's user and system time so far, all its threads, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def quiet(pid: int, idle: float = QUIET_S, timeout: float = 10.0) -> float:
    """Wait until `pid` has used no CPU for `idle` seconds (at most `timeout`): what gpumemd
    does after a file's release (its parity, freeing its memory) is not charged to the dd
    that follows on another place. Returns the seconds waited."""
    t0 = time.monotonic()
    last = cpu_ticks(pid)
    while last is not None and time.monotonic() - t0 < timeout:
        time.sleep(idle)
        now = cpu_ticks(pid)
        if now == last:
            break
        last = now
    return time.monotonic() - t0


def one_run(where: dict[str, str], r: int, runs: int, floor, src: str, src_hash: str,
            size: int, pid: int) -> tuple[dict, dict]:
    """Each place's dd seconds per row, and the floor's requests per opcode per block
    size."""
    names = list(where)
    order = names[r % len(names):] + names[:r % len(names)]
    secs: dict = {w: {} for w in where}
    requests: dict = {}
    for bs in BLOCK_SIZES:
        for w in order:
            say(f"{w}: run {r + 1}/{runs}: dd write and read of {fs.format_size(size)}, "
                f"bs={bs}")
            dst = os.path.join(where[w], f"bulk{r}-{bs}")
            secs[w][f"quiet_{bs}"] = quiet(pid)
            before = floor.counts() if w == "floor" else None
            result = fs.seq_once(src, dst, bs, size, fsync=False, cold=False)
            if before is not None:
                after = floor.counts()
                requests[bs] = {op: c - before.get(op, 0) for op, c in after.items()
                                if c != before.get(op, 0)}
            if r == 0:
                fs.verify(dst, size, src_hash)
            os.unlink(dst)
            secs[w][f"write_{bs}"] = result["write"]["dd_s"]
            secs[w][f"read_{bs}"] = result["read"]["dd_s"]
    return secs, requests


def read_ahead_kb(path: str) -> int | None:
    """read_ahead_kb of the backing device of the mount at `path` (None: not found)."""
    try:
        with open("/proc/self/mountinfo") as f:
            devices = [line.split()[2] for line in f
                       if line.split()[4].replace("\\040", " ") == path]
        with open(f"/sys/class/bdi/{devices[-1]}/read_ahead_kb") as f:
            return int(f.read())
    except (OSError, IndexError, ValueError):
        return None


def measure(where: dict[str, str], runs: int, floor, size: int, pid: int) -> dict:
    """The rows' figures; `pid` is gpumemd's (quiet())."""
    src = os.path.join(where["tmpfs"], "bulk-src")
    src_hash = fs.make_source(src, size)
    try:
        results = [one_run(where, r, runs, floor, src, src_hash, size, pid) for r in range(runs)]
    finally:
        os.unlink(src)
    found = re.search(" ".join(rf"{k}=(\d+)" for k in LIMITS), floor.log())
    return {"size": size,
            "seconds": {w: {k: statistics.median(s[w][k] for s, _ in results)
                            for k, _, _ in ROWS} for w in where},
            "requests": {k: statistics.median(q[k.split("_")[1]].get(op, 0)
                                              for _, q in results) for k, _, op in ROWS},
            "limits": dict(zip(LIMITS, map(int, found.groups()), strict=True))
            if found else None,
            "read_ahead_kb": {w: read_ahead_kb(where[w]) for w in ("floor", "gpumemd")},
            "runs": [{"seconds": s, "requests": q} for s, q in results]}


# ---- report -------------------------------------------------------------------------------
def rows_from(bulk: dict) -> list[dict]:
    size, secs = bulk["size"], bulk["seconds"]
    rows = []
    for key, what, op in ROWS:
        tmpfs, floor, gpumemd = (secs[w][key] for w in ("tmpfs", "floor", "gpumemd"))
        n = bulk["requests"][key]

        def cost(s: float, n=n, tmpfs=tmpfs) -> str:
            return f"{(s - tmpfs) / n * 1e6:.0f}" if n else "-"

        rows.append({
            "bulk data (GB/s)": what.format(size=fs.format_size(size)),
            "tmpfs": f"{fs.gbps(size, tmpfs):.2f}",
            "C floor": f"{fs.gbps(size, floor):.2f} ({tmpfs / floor:.2f}x)",
            "gpumemd": f"{fs.gbps(size, gpumemd):.2f} ({tmpfs / gpumemd:.2f}x)",
            "gpumemd / floor": f"{floor / gpumemd:.2f}x",
            "floor requests / MiB": f"{op} {n / (size / MiB):.2f}",
            "us/request, floor": cost(floor), "us/request, gpumemd": cost(gpumemd)})
    return rows


def print_table(bulk: dict, rows: list[dict]) -> None:
    lim, ra = bulk["limits"] or {}, bulk["read_ahead_kb"]
    limits = ", ".join(f"{k} {v}" for k, v in lim.items()) or "not logged"
    print(f"bulk data: a {fs.format_size(bulk['size'])} file; ratios are to tmpfs's GB/s "
          "(above 1.00x: faster than tmpfs); us/request = (seconds - tmpfs's seconds) / the "
          "floor's requests of the row, for each mount")
    print(f"the floor's init (libfuse's, untouched as by pyfuse3): {limits} (0: libfuse's "
          f"or the kernel's default); read_ahead_kb after the mount: floor {ra['floor']}, "
          f"gpumemd {ra['gpumemd']}")
    print()
    print("\n".join(core.markdown_table(rows, list(rows[0]))))
