#!/usr/bin/env python3
"""The floor of FUSE on this kernel: bench/mount_apps.py's `ls -l` and SQLite workloads and
bench/fs.py's `dd` rows on tmpfs, on a minimal FUSE filesystem in C (bench/fuse_floor.c) and
on gpumemd's mount, in the same run.

    python3 bench/mount_floor.py                # table on stdout
    python3 bench/mount_floor.py --files 10000 --inserts 2000 --runs 3
    python3 bench/mount_floor.py --backend cuda --json
    python3 bench/mount_floor.py --cpu 0        # all on one CPU
    python3 bench/mount_floor.py --rows bulk --size 1G    # the dd rows alone
    python3 bench/mount_floor.py --floor-binary PATH      # fuse_floor.c built elsewhere

bench/fuse_floor.c answers every request at once, from C, on one thread, with gpumemd's
mount options, init flags, timeouts and open flags (its top comment lists them): what it
costs over tmpfs is what any FUSE filesystem pays for the workload here; what gpumemd costs
over it is gpumemd's own. The floor also counts its requests per opcode, so each row says how
many requests the workload makes and what each costs over tmpfs on either mount:
(seconds - tmpfs's seconds) / requests. gpumemd is taken to make the same requests (same
flags and timeouts: the script checks that the init flags agree).

A request's round trip includes waking the filesystem's thread and then the caller's. Where
the two sit on different CPUs of a VM, each wake-up is an interrupt to another virtual CPU,
several times dearer than a switch on one, and the scheduler does not always place them the
same way from run to run: --cpu pins everything to one CPU to take that out.

It compiles fuse_floor.c (`cc -O2`, pkg-config fuse3) into a fresh /tmp/gpumemctl-floor-*
directory and mounts it there (a foreground process); it starts its own gpumemd (bench/fs.py's
MountDaemon) in a fresh /tmp/gpumemctl-floorbench-* directory, and uses a fresh
/dev/shm/gpumemctl-floorbench-* directory as tmpfs. At the end, also on an error or Ctrl-C,
the floor is unmounted (fusermount3 -u; it exits) and gpumemd stopped, and all three
directories go. Progress goes to stderr; only the table (or the JSON) to stdout.
GPUMEMD_FUSE_INIT and GPUMEMD_MOUNT_WRITE_ONLY reach both filesystems.

Rows (the median of --runs runs; each run goes through the three in a rotated order):
  1. `ls -l` of a directory of --files empty files, right after a listing (attributes
     fresh), and after sleeping past ENTRY_TIMEOUT (every attribute fetched again);
  2. SQLite: --inserts single-row INSERTs, each its own transaction, rollback journal
     (journal_mode=DELETE, synchronous=FULL), into a new database;
  3. bulk data (bench/floor_bulk.py): `dd` write of a --size file (256M; 1G on cuda) with
     bs=1M to a new file (write-only: direct I/O on both FUSE mounts), `dd` read bs=1M right
     after; the same with bs=128K; GB/s, and the floor's WRITE or READ requests per MiB.
The measuring functions are bench/mount_apps.py's (1, 2) and bench/fs.py's (3). --rows
apps or --rows bulk runs only those.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
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
import floor_bulk  # noqa: E402  bench/floor_bulk.py: the dd rows
import fs  # noqa: E402  bench/fs.py: the mount daemon, the machine, the frame
import mount_apps  # noqa: E402  bench/mount_apps.py: the workloads

from daemon.fs.attrs import ENTRY_TIMEOUT  # noqa: E402
from daemon.fs.files import write_only_direct  # noqa: E402
from daemon.fs.initflags import FLAGS  # noqa: E402
from daemon.fs.mount import (  # noqa: E402
    READ_AHEAD_KB,
    init_flags_asked,
    mount_options,
    set_read_ahead,
)

say = core.say
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuse_floor.c")
FLOOR_FS_TYPE = "fuse.floor"
WHERE = {"tmpfs": "tmpfs", "floor": "C floor", "gpumemd": "gpumemd"}
# Requests still on their way when a workload returns (RELEASE after close(2) is sent in
# the background) are given this long before the floor's counts are read.
SETTLE_S = 0.05


# ---- the C floor --------------------------------------------------------------------------
def mask(names) -> int:
    out = 0
    for name in names:
        out |= FLAGS[name]
    return out


def flag_names(value: int) -> list[str]:
    return [name for name, bit in FLAGS.items() if value & bit]


def quiet(argv: list[str]) -> int:
    """A command's exit status, its output dropped; -1 where it cannot be run."""
    try:
        return subprocess.run(argv, capture_output=True).returncode
    except OSError:
        return -1


class Floor:
    """bench/fuse_floor.c, built and mounted in a fresh /tmp/gpumemctl-floor-* directory."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="gpumemctl-floor-", dir="/tmp")
        self.binary = os.path.join(self.dir, "fuse_floor")
        self.mnt = os.path.join(self.dir, "mnt")
        self.counts_path = os.path.join(self.dir, "counts")
        self.log_path = os.path.join(self.dir, "fuse_floor.log")
        self.proc: subprocess.Popen | None = None
        self.seq = 0
        self.premade = 0            # -P: bytes of file pages made at the start

    def build(self, prebuilt: str | None = None) -> list[str]:
        if prebuilt:            # built elsewhere: a machine without a compiler or libfuse3-dev
            shutil.copy(prebuilt, self.binary)
            say(f"the C floor: {prebuilt}, built elsewhere")
            return [prebuilt]
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True,
                               capture_output=True, text=True).stdout.split()
        argv = ["cc", "-O2", "-Wall", "-o", self.binary, SOURCE, *flags]
        say(" ".join(argv))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
        return argv

    def argv(self) -> list[str]:
        """gpumemd's choices as arguments: its mount options (another fsname and subtype),
        the init flags its library sets and clears (daemon/fs/mount.py, GPUMEMD_FUSE_INIT
        included), how it opens write-only, its entry timeout; and -P, bytes of file pages
        made at the start (the bulk rows' file: fuse_floor.c, "file data")."""
        set_, clear = init_flags_asked()
        options = sorted(o for o in mount_options() if not o.startswith(("fsname=", "subtype=")))
        argv = [self.binary, "-o", ",".join(options + ["fsname=fuse_floor", "subtype=floor"]),
                "-c", self.counts_path, "-s", hex(mask(set_)), "-x", hex(mask(clear))]
        argv += [] if write_only_direct() else ["-W"]
        return argv + (["-P", str(self.premade)] if self.premade else []) + \
            [self.mnt, str(ENTRY_TIMEOUT)]

    def start(self, timeout: float = 10.0) -> None:
        os.mkdir(self.mnt)
        argv = self.argv()
        say(f"mounting the C floor: {' '.join(argv)}")
        with open(self.log_path, "wb") as log:
            # its own session: a Ctrl-C reaches this script, which unmounts it
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while fs.mount_type(self.mnt) != FLOOR_FS_TYPE:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fuse_floor exited {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fuse_floor did not mount {self.mnt} in {timeout} s")
            time.sleep(0.01)
        os.statvfs(self.mnt)            # answered once the kernel has the init reply
        set_read_ahead(self.mnt, READ_AHEAD_KB)     # as gpumemd does (root only)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def want(self) -> int | None:
        """The init flags it asked for (its log's init line)."""
        found = re.search(r"init capable=0x([0-9a-f]+) want=0x([0-9a-f]+)", self.log())
        return int(found.group(2), 16) if found else None

    def counts(self, timeout: float = 5.0) -> dict[str, int]:
        """Requests served so far, by opcode. SIGUSR1 asks for them; it is sent again until
        they come (one that lands while a request is served interrupts no wait)."""
        assert self.proc is not None
        time.sleep(SETTLE_S)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.send_signal(signal.SIGUSR1)
            for _ in range(20):
                time.sleep(0.002)
                try:
                    with open(self.counts_path) as f:
                        lines = [line.split() for line in f if line.strip()]
                except FileNotFoundError:
                    continue
                if lines and int(lines[0][1]) > self.seq:
                    self.seq = int(lines[0][1])
                    return {op: int(n) for op, n in lines[1:]}
        raise RuntimeError(f"fuse_floor wrote no counts in {timeout} s: {self.log()}")

    def stop(self) -> str:
        """Unmount (fusermount3 -u: the floor sees its device close and exits); SIGTERM,
        then SIGKILL and a lazy unmount where that fails. Removes the directory once nothing
        is mounted on it. Never raises; says how it went."""
        how = "not mounted"
        if fs.mount_type(self.mnt) is not None:
            how = "fusermount3 -u" if quiet(["fusermount3", "-u", self.mnt]) == 0 else \
                "fusermount3 -u failed"
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((None, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                if sig is not None:
                    self.proc.send_signal(sig)
                    how += f"; {signal.Signals(sig).name}"
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if fs.mount_type(self.mnt) is not None:
            quiet(["fusermount3", "-u", "-z", self.mnt])
            how += "; fusermount3 -u -z"
        if fs.mount_type(self.mnt) is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            say(f"{self.mnt} is still mounted; left {self.dir} in place")
            how += "; STILL MOUNTED"
        return how


# ---- the workloads ------------------------------------------------------------------------
def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    out = {op: n - before.get(op, 0) for op, n in after.items()}
    return {op: n for op, n in sorted(out.items(), key=lambda kv: -kv[1]) if n}


def one_run(where: dict[str, str], r: int, args, floor: Floor) -> tuple[dict, dict]:
    """Each place's seconds per workload, and the requests the floor served for each. The
    order of the places rotates with the run; one sleep past the timeout serves all three."""
    names = list(where)
    order = names[r % len(names):] + names[:r % len(names)]
    secs: dict = {w: {} for w in where}
    requests: dict = {}

    def timed(w: str, key: str, fn) -> None:
        before = floor.counts() if w == "floor" else None
        secs[w][key] = fn()
        if before is not None:
            requests[key] = diff(floor.counts(), before)

    tops = {w: os.path.join(where[w], f"ls{r}") for w in where}
    for w in order:
        say(f"{WHERE[w]}: run {r + 1}/{args.runs}: {args.files} files, ls -l")
        mount_apps.make_files(tops[w], args.files)
        mount_apps.ls_l(tops[w], args.files)              # fills the caches
        timed(w, "ls_warm", lambda w=w: mount_apps.ls_l(tops[w], args.files))
    say(f"sleeping {ENTRY_TIMEOUT + 0.5:g} s, past the attribute timeout")
    time.sleep(ENTRY_TIMEOUT + 0.5)
    for w in order:
        timed(w, "ls_cold", lambda w=w: mount_apps.ls_l(tops[w], args.files))
    for w in order:
        say(f"{WHERE[w]}: run {r + 1}/{args.runs}: {args.inserts} SQLite transactions")
        db = os.path.join(where[w], f"db{r}.sqlite")
        timed(w, "sqlite", lambda db=db: mount_apps.sqlite_inserts(db, args.inserts))
    return secs, requests


def measure(where: dict[str, str], args, floor: Floor) -> dict:
    # The requests of a database's set-up and close alone (no INSERT), taken off the
    # SQLite count so that what is left is per transaction.
    before = floor.counts()
    mount_apps.sqlite_inserts(os.path.join(floor.mnt, "setup.sqlite"), 0)
    setup = diff(floor.counts(), before)
    runs = [one_run(where, r, args, floor) for r in range(args.runs)]
    keys = list(runs[0][0]["floor"])
    return {"seconds": {w: {k: statistics.median(s[w][k] for s, _ in runs) for k in keys}
                        for w in where},
            "requests": {k: statistics.median(sum(q[k].values()) for _, q in runs)
                         for k in keys},
            "runs": [{"seconds": s, "requests": q} for s, q in runs],
            "sqlite_setup_requests": setup}


# ---- report -------------------------------------------------------------------------------
ROWS = (("ls_warm", "ls -l of {files} files, attributes fresh", "files", "file"),
        ("ls_cold", "ls -l of {files} files, after the attribute timeout", "files", "file"),
        ("sqlite", "SQLite: {inserts} INSERT transactions, rollback journal", "inserts",
         "transaction"))


def per_unit(fig: dict, key: str, unit: str) -> tuple[float, dict[str, float]]:
    """Requests per unit of the workload (the median run's total; by opcode, the first
    run's), the SQLite set-up taken off."""
    res, n = fig["results"], fig["config"][unit]
    by_op = dict(res["runs"][0]["requests"][key])
    total = res["requests"][key]
    if key == "sqlite":
        setup = res["sqlite_setup_requests"]
        total -= sum(setup.values())
        by_op = {op: c - setup.get(op, 0) for op, c in by_op.items()}
    return total / n, {op: c / n for op, c in by_op.items() if c > 0}


def rows_from(fig: dict) -> list[dict]:
    bulk = floor_bulk.rows_from(fig["bulk"]) if "bulk" in fig else []
    return (app_rows(fig) if "results" in fig else []) + bulk


def app_rows(fig: dict) -> list[dict]:
    res, c = fig["results"], fig["config"]
    secs, rows = res["seconds"], []
    for key, what, unit, unit_name in ROWS:
        tmpfs = secs["tmpfs"][key]
        requests = res["requests"][key]
        per, _ = per_unit(fig, key, unit)

        def cost(w: str, key=key, tmpfs=tmpfs, requests=requests) -> str:
            return f"{(secs[w][key] - tmpfs) / requests * 1e6:.1f}" if requests else "-"

        rows.append({
            "workload": what.format(**c), "tmpfs (s)": f"{tmpfs:.3f}",
            "C floor (s)": f"{secs['floor'][key]:.3f} ({secs['floor'][key] / tmpfs:.1f}x)",
            "gpumemd (s)": f"{secs['gpumemd'][key]:.3f} ({secs['gpumemd'][key] / tmpfs:.1f}x)",
            "gpumemd / floor": f"{secs['gpumemd'][key] / secs['floor'][key]:.1f}x",
            "FUSE requests": f"{requests:,.0f} ({per:.2f}/{unit_name})",
            "us/request, floor": cost("floor"), "us/request, gpumemd": cost("gpumemd")})
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    c = fig["config"]
    print(fs.machine_line(fig, f"gpumemd --backend {c['backend']}; "
                               f"GPUMEMD_FUSE_INIT={c['init'] or '(unset)'}"))
    cpus = "all CPUs" if c["cpu"] is None else f"everything pinned to CPU {c['cpu']}"
    print(f"{cpus}; median of {c['runs']} run(s); SQLite {sqlite3.sqlite_version}; libfuse "
          f"{c['libfuse']}; entry/attribute timeout {ENTRY_TIMEOUT:g} s on both mounts")
    print(f"init flags: {fig['init']['verdict']}")
    if "results" in fig:
        print_apps(fig, [r for r in rows if "workload" in r])
    if "bulk" in fig:
        print()
        floor_bulk.print_table(fig["bulk"], [r for r in rows if "workload" not in r])
    print()
    print(f"wall {fig['wall_s']:.1f} s; C floor stopped by {fig.get('floor_stop')}; gpumemd "
          f"exit {fig['stop'].get('exit')}, mount removed by {fig['stop'].get('unmounted_by')}")


def print_apps(fig: dict, rows: list[dict]) -> None:
    c = fig["config"]
    print()
    print("\n".join(core.markdown_table(rows, list(rows[0]))))
    print()
    print("FUSE requests counted on the C floor (gpumemd's taken to be the same); "
          "us/request = (seconds - tmpfs's seconds) / requests. By opcode, per unit:")
    for key, what, unit, unit_name in ROWS:
        _, by_op = per_unit(fig, key, unit)
        ops = ", ".join(f"{op} {n:.2f}" if n >= 0.1 else f"{op} {n:.4f}"
                        for op, n in sorted(by_op.items(), key=lambda kv: -kv[1]))
        print(f"- {what.format(**c)}, per {unit_name}: {ops}")
    setup = fig["results"]["sqlite_setup_requests"]
    print(f"- SQLite set-up and close alone (taken off above): {sum(setup.values())} "
          f"requests")


def compare_init(floor: Floor, d: fs.MountDaemon) -> dict:
    """The init flags each mount asked for: the floor's log, gpumemd's (mount.py logs them
    half a second after the mount)."""
    want = floor.want()
    found = None
    deadline = time.monotonic() + 5
    while found is None and time.monotonic() < deadline:
        found = re.search(r"FUSE init: asked for (\S*) \(offered", d.log_tail(1 << 20))
        if found is None:
            time.sleep(0.1)
    floor_flags = flag_names(want) if want is not None else None
    gpumemd_flags = found.group(1).split(",") if found else None
    if floor_flags is None or gpumemd_flags is None:
        verdict = (f"not compared (floor {floor_flags}, gpumemd "
                   f"{gpumemd_flags or 'logged none'})")
    elif set(floor_flags) == set(gpumemd_flags):
        verdict = f"the same on both mounts: {','.join(floor_flags)}"
    else:
        verdict = (f"DIFFER: floor only {sorted(set(floor_flags) - set(gpumemd_flags))}, "
                   f"gpumemd only {sorted(set(gpumemd_flags) - set(floor_flags))}")
    return {"floor": floor_flags, "gpumemd": gpumemd_flags, "verdict": verdict}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="host", choices=("host", "cuda", "auto"),
                   help="gpumemd's backend (host)")
    p.add_argument("--files", type=int, default=10000, help="files listed by ls -l (10000)")
    p.add_argument("--inserts", type=int, default=2000, help="SQLite transactions (2000)")
    p.add_argument("--size", default=None,
                   help="bytes of the dd file (256M on host, 1G on cuda)")
    p.add_argument("--rows", default="all", choices=("all", "apps", "bulk"),
                   help="apps: ls -l and SQLite; bulk: dd; all (the default): both")
    p.add_argument("--runs", type=int, default=3, help="runs; the median is shown (3)")
    p.add_argument("--cpu", type=int, default=None,
                   help="pin everything (this script, ls, gpumemd, the floor) to this CPU")
    p.add_argument("--host-capacity", default="2G", help="passed to gpumemd (host backend)")
    p.add_argument("--keep", action="store_true", help="keep gpumemd's temp dir (its log)")
    p.add_argument("--floor-binary", default=None, metavar="PATH",
                   help="bench/fuse_floor.c built elsewhere (cc -O2 bench/fuse_floor.c "
                        "$(pkg-config --cflags --libs fuse3)), for a machine without "
                        "libfuse3-dev")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if min(args.files, args.inserts, args.runs) < 1:
        p.error("--files, --inserts and --runs must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = fs.pick_backend(args.backend)
    size = fs.parse_size(args.size or floor_bulk.default_size(backend))
    if args.rows != "apps":
        fs.check_shm(size)
    if args.cpu is not None:      # inherited by every process started from here on
        os.sched_setaffinity(0, {args.cpu})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-floorbench-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-floorbench-", dir="/dev/shm")
    d = fs.MountDaemon(base, backend, args.host_capacity if backend == "host" else None)
    libfuse = subprocess.run(["pkg-config", "--modversion", "fuse3"], capture_output=True,
                             text=True).stdout.strip()
    fig: dict = {"machine": fs.machine(backend), "base_dir": base,
                 "config": {"backend": backend, "files": args.files, "inserts": args.inserts,
                            "runs": args.runs, "entry_timeout": ENTRY_TIMEOUT,
                            "rows": args.rows, "size": size,
                            "cpu": args.cpu,
                            "libfuse": libfuse or "?",
                            "init": os.environ.get("GPUMEMD_FUSE_INIT", "")},
                 "loadavg": [round(os.getloadavg()[0], 2)]}

    def body() -> None:
        floor = Floor()
        floor.premade = size if args.rows != "apps" else 0
        try:
            fig["floor_build"] = floor.build(args.floor_binary)
            floor.start()
            fig["floor_argv"] = floor.argv()
            fig["init"] = compare_init(floor, d)
            say(f"init flags: {fig['init']['verdict']}")
            assert d.mnt is not None              # a MountDaemon always mounts
            where = {"tmpfs": shm, "floor": floor.mnt, "gpumemd": d.mnt}
            if args.rows != "bulk":
                fig["results"] = measure(where, args, floor)
            if args.rows != "apps":
                assert d.proc is not None
                fig["bulk"] = floor_bulk.measure(where, args.runs, floor, size, d.proc.pid)
        finally:
            fig["floor_stop"] = floor.stop()

    stopped = fs.serve_and_measure(d, fig, shm, base, args.keep, body)
    if stopped is not None:
        return stopped
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
