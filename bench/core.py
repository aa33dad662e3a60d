#!/usr/bin/env python3
"""Core benchmarks of gpumemd (host backend): CLI listing, create/remove round trips, restarts.

    python3 bench/core.py            # table on stdout
    python3 bench/core.py --json     # the same figures as one JSON document

It starts its own gpumemd (`--backend host`) in a fresh directory under /tmp, with its own
socket and state directory, and removes all of it at the end: the daemon, the keeper process
(pid from STATE_DIR/keeper.pid) and the temporary directory. Progress goes to stderr; only
the table (or the JSON) goes to stdout. What each row means: bench/README.md.

Phases (the whole run takes about a minute on a 2-core VM):
  1. `gpumemctl ls -R --json DIR` (the real console script, a subprocess) with 1000
     allocations in DIR, and `gpumemctl ls --json` of an empty directory (what a script's
     loop pays per call), against the startup floor `python -c pass` in the same run.
  2. create+rm round trips through gpumemctl.Client: transient, durable (fsync path), and
     the `status` / `info` round trips as RPC baselines.
  3. restarts re-adopting 1000 durable allocations: kill -9 then start, and SIGTERM then
     start; the clock runs from spawning gpumemd until `ls -R` shows all 1000 ready.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gpumemctl import Client  # noqa: E402
from gpumemctl.protocol import NotRunning  # noqa: E402
from tests import harness  # noqa: E402  the daemon harness the tests use too

PYTHON = sys.executable
N_ALLOCS = 1000
N_DIRS = 10
ALLOC_SIZE = 4096
PATTERN_INDEXES = (0, 1, 499, 777, 999)   # durable allocations that carry a known pattern


# ---- small helpers -------------------------------------------------------------------------
def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def console_script(name: str) -> list[str]:
    """The installed console script next to this interpreter; else run the module."""
    return harness.script_argv(name, installed=True)


def clean_env() -> dict:
    """The tests' environment for a child (tests/harness.py), with one difference: the CLI as
    installed, where pip compiled its bytecode at install time. A development shell's
    PYTHONDONTWRITEBYTECODE would have every run compile gpumemctl's modules again (the
    warm-up runs write the cache)."""
    env = harness.child_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    """sha256 of a file, read into one reused buffer."""
    digest, buf = hashlib.sha256(), bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def emit(fig: dict, rows: list[dict], as_json: bool, print_table) -> None:
    """The end of every bench script: the rows and raw figures as JSON, or the table."""
    if as_json:
        json.dump({"rows": rows, "figures": fig}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(fig, rows)


def show_log_tail(d) -> None:
    """On a benchmark's failure: the end of its gpumemd's log, on stderr."""
    tail = d.log_tail()
    if tail:
        print(f"--- gpumemd log tail ({d.log_path}) ---\n{tail}", file=sys.stderr)


def markdown_table(rows: list[dict], keys: list[str]) -> list[str]:
    """Rows as a Markdown table: the first column left-aligned, the rest right-aligned."""
    widths = [max(len(k), *(len(r[k]) for r in rows)) for k in keys]
    lines = ["| " + " | ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)) + " |",
             "| " + " | ".join("-" * w for w in widths) + " |"]
    for r in rows:
        cells = [r[keys[0]].ljust(widths[0])] + [r[k].rjust(w) for k, w in
                                                 zip(keys[1:], widths[1:], strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pct(values: list[float], p: float) -> float:
    """Percentile by linear interpolation between closest ranks (p in 0..100)."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values_s: list[float]) -> dict:
    ms = [v * 1000.0 for v in values_s]
    return {"n": len(ms), "min_ms": min(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90),
            "p99_ms": pct(ms, 99), "max_ms": max(ms), "mean_ms": statistics.fmean(ms)}


def pattern(i: int) -> bytes:
    return (hashlib.sha256(f"gpumemctl-bench-{i}".encode()).digest() * (ALLOC_SIZE // 32))


def machine() -> dict:
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "tmp_fs": fs_type("/tmp"),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding `path` (durable commits fsync there)."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                mnt = fields[1]
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


# ---- the daemon under test -----------------------------------------------------------------
class Daemon(harness.Daemon):
    """tests/harness.py's gpumemd, as a benchmark runs it: the installed console script, the
    daemon's default log level (debug lines would be timed too), the environment of
    clean_env(); plus what the figures need (a connect that polls fast, timed stops, the
    daemon's own account of its start)."""

    def __init__(self, base: str, backend: str = "host", extra_args=(), mount: bool = False):
        super().__init__(base, backend=backend, extra_args=extra_args, mount=mount,
                         log_level=None, installed=True)

    def environment(self) -> dict:
        env = clean_env()
        env.update(self.extra_env)
        return env

    def connect(self, timeout: float = 30.0, interval: float = 0.002) -> Client:
        """A Client as soon as the socket serves (polls)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gpumemd exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                return Client(self.socket)
            except NotRunning:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"gpumemd did not serve {self.socket} in {timeout}s") from None
                time.sleep(interval)

    def terminate(self) -> float:
        """SIGTERM and wait; returns the seconds the clean stop took."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        took = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"gpumemd exited {code} after SIGTERM:\n{self.log_tail()}")
        return took

    def last_start_summary(self) -> dict | None:
        """What the current daemon's log says about its start: the adoption counts, and the
        seconds from 'backend chosen' to 'registry loaded' (keeper connect + fetch + adopt)."""
        pid = self.proc.pid
        stamp = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) gpumemd\[" + str(pid) + r"\] \w+: "
        text = self.log_tail(8 << 20)
        # "N orphans re-registered" is optional: a daemon from before issue 13 does not log
        # it, and a before/after comparison runs this on both.
        found = re.search(stamp + r"registry loaded: (\d+) adopted, (\d+) lost, (\d+) orphans "
                          r"freed, (?:\d+ orphans re-registered, )?(\d+) stale transients "
                          r"dropped", text)
        if not found:
            return None
        a, lost, orph, drop = map(int, found.groups()[2:])
        out = {"adopted": a, "lost": lost, "orphans_freed": orph, "transients_dropped": drop}
        chosen = re.search(stamp + r"backend \w+ chosen", text)
        if chosen:
            def secs(m):
                return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + \
                    int(m.group(2)) / 1000
            out["adopt_phase_s"] = secs(found) - secs(chosen)
        return out


# ---- phase 1: gpumemctl ls ------------------------------------------------------------------
def time_cmd(argv: list[str], runs: int, warmup: int = 2, check=None,
             cpu: list | None = None) -> list[float]:
    """Wall time of each run; with `cpu`, also append each run's user+sys CPU seconds
    (RUSAGE_CHILDREN deltas: exact, as nothing else of ours is reaped meanwhile)."""
    env = clean_env()
    times = []
    for i in range(warmup + runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, env=env)
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None and i >= warmup:
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                               f"{proc.stderr.decode(errors='replace')[-2000:]}")
        if check is not None:
            check(proc.stdout)
        if i >= warmup:
            times.append(dt)
    return times


def _fail(what: str, out: bytes):
    raise RuntimeError(f"{what}: unexpected output {out[:200]!r}")


def phase_ls(d: Daemon, c: Client, runs: int) -> dict:
    say(f"phase 1: creating {N_ALLOCS} transient {ALLOC_SIZE}-byte allocations "
        f"in {N_DIRS} directories")
    t0 = time.perf_counter()
    for i in range(N_ALLOCS):
        c.create(f"bench1k/d{i % N_DIRS:02d}/a{i:04d}", ALLOC_SIZE)
    fill_s = time.perf_counter() - t0
    listing = "bench1k"
    want_entries = N_ALLOCS + N_DIRS

    def check(stdout: bytes) -> None:
        entries = json.loads(stdout)
        allocs = sum(1 for e in entries if e["type"] == "allocation")
        if len(entries) != want_entries or allocs != N_ALLOCS:
            raise RuntimeError(f"ls listed {len(entries)} entries ({allocs} allocations), "
                               f"expected {want_entries} ({N_ALLOCS})")

    ls_argv = console_script("gpumemctl") + ["--socket", d.socket, "ls", "-R", "--json",
                                             listing]
    say(f"phase 1: timing `gpumemctl ls -R --json {listing}` x{runs}")
    ls_cpu: list[float] = []
    ls_times = time_cmd(ls_argv, runs, check=check, cpu=ls_cpu)
    c.mkdir("empty")
    say(f"phase 1: timing `gpumemctl ls --json empty` (an empty directory) x{runs}")
    empty_argv = console_script("gpumemctl") + ["--socket", d.socket, "ls", "--json", "empty"]
    empty_times = time_cmd(empty_argv, runs,
                           check=lambda out: json.loads(out) == [] or _fail("ls empty", out))
    say(f"phase 1: timing `python -c pass` and `python -c 'import gpumemctl.cli.typerapp'` "
        f"x{runs}")
    floor_cpu: list[float] = []
    floor_times = time_cmd([PYTHON, "-c", "pass"], runs, cpu=floor_cpu)
    import_times = time_cmd([PYTHON, "-c", "import gpumemctl.cli.typerapp"], runs)
    rpc_times = []
    for i in range(2 + runs):
        t = time.perf_counter()
        entries = c.ls(listing, recursive=True)
        dt = time.perf_counter() - t
        if len(entries) != want_entries:
            raise RuntimeError(f"Client.ls listed {len(entries)} entries")
        if i >= 2:
            rpc_times.append(dt)
    return {"listing": f"ls -R --json {listing}", "entries": want_entries,
            "allocations": N_ALLOCS, "fill_s": fill_s,
            "ls": summary(ls_times), "ls_cpu": summary(ls_cpu),
            "ls_empty_dir": summary(empty_times),
            "python_pass": summary(floor_times), "python_pass_cpu": summary(floor_cpu),
            "import_typer_app": summary(import_times), "client_ls_rpc": summary(rpc_times)}


# ---- phase 2: round trips -------------------------------------------------------------------
def round_trips(c: Client, iters: int, durable: bool, warmup: int = 20) -> list[float]:
    path = "roundtrip/durable" if durable else "roundtrip/transient"
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        c.create(path, ALLOC_SIZE, durable=durable)
        c.remove(path)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return times


def rpc_loop(fn, iters: int, warmup: int = 20) -> list[float]:
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return times


def phase_round_trips(c: Client, iters: int, durable_iters: int) -> dict:
    say(f"phase 2: status / info round trips x{iters}")
    status = rpc_loop(c.status, iters)
    info = rpc_loop(lambda: c.info("bench1k/d00/a0000"), iters)
    say(f"phase 2: transient create+rm x{iters}")
    transient = round_trips(c, iters, durable=False)
    say(f"phase 2: durable create+rm x{durable_iters}")
    durable = round_trips(c, durable_iters, durable=True)
    return {"status": summary(status), "info": summary(info),
            "transient_create_rm": {**summary(transient), **outliers(transient)},
            "durable_create_rm": {**summary(durable), **outliers(durable)}}


def outliers(times: list[float], factor: float = 4.0) -> dict:
    """Iterations slower than factor x p50, and the median spacing between them: a steady
    spacing points at periodic work on the request path (e.g. a WAL checkpoint)."""
    limit = pct(times, 50) * factor
    slow = [i for i, t in enumerate(times) if t > limit]
    gaps = [b - a for a, b in itertools.pairwise(slow)]
    return {"slow_factor": factor, "slow_count": len(slow),
            "slow_gap_median": statistics.median(gaps) if gaps else None}


# ---- phase 3: restarts ------------------------------------------------------------------------
def wait_all_ready(d: Daemon, t_spawn: float, timeout: float = 60.0) -> dict:
    """Connect as soon as possible, then ls -R until all N_ALLOCS are ready. Timestamps are
    seconds after the spawn."""
    c = d.connect(timeout=timeout)
    t_conn = time.perf_counter() - t_spawn
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        entries = c.ls("durable", recursive=True)
        polls += 1
        ready = sum(1 for e in entries if e["type"] == "allocation" and e["state"] == "ready")
        if ready == N_ALLOCS:
            break
        if time.monotonic() > deadline:
            c.close()
            raise RuntimeError(f"only {ready} of {N_ALLOCS} allocations ready after restart")
        time.sleep(0.005)
    t_ready = time.perf_counter() - t_spawn
    bad = [i for i in PATTERN_INDEXES if c.read(durable_path(i)) != pattern(i)]
    c.close()
    d.note_keeper()
    if bad:
        raise RuntimeError(f"pattern mismatch after restart in {[durable_path(i) for i in bad]}")
    return {"connect_s": t_conn, "ready_s": t_ready, "ls_polls": polls,
            "start_summary": d.last_start_summary()}


def durable_path(i: int) -> str:
    return f"durable/d{i % N_DIRS:02d}/a{i:04d}"


def phase_restart(d: Daemon, c: Client, restarts: int) -> dict:
    say("phase 3: removing the phase-1 allocations")
    c.remove("bench1k", recursive=True)
    c.remove("roundtrip", recursive=True)
    say(f"phase 3: creating {N_ALLOCS} durable {ALLOC_SIZE}-byte allocations")
    t0 = time.perf_counter()
    for i in range(N_ALLOCS):
        c.create(durable_path(i), ALLOC_SIZE, durable=True)
    fill_s = time.perf_counter() - t0
    for i in PATTERN_INDEXES:
        c.write(durable_path(i), pattern(i))
    c.close()

    hard = []
    for n in range(restarts):
        say(f"phase 3: kill -9 restart {n + 1}/{restarts}")
        d.kill9()
        hard.append(wait_all_ready(d, d.spawn()))
    soft = []
    for n in range(restarts):
        say(f"phase 3: SIGTERM restart {n + 1}/{restarts}")
        stop_s = d.terminate()
        r = wait_all_ready(d, d.spawn())
        r["stop_s"] = stop_s
        soft.append(r)
    for r in hard + soft:
        s = r["start_summary"] or {}
        if s.get("adopted") != N_ALLOCS:
            raise RuntimeError(f"a restart adopted {s.get('adopted')} allocations, "
                               f"expected {N_ALLOCS}: {s}")
    return {"durable_fill_s": fill_s, "kill9": hard, "sigterm": soft,
            "kill9_ready_median_s": statistics.median(r["ready_s"] for r in hard),
            "kill9_connect_median_s": statistics.median(r["connect_s"] for r in hard),
            "sigterm_ready_median_s": statistics.median(r["ready_s"] for r in soft),
            "sigterm_connect_median_s": statistics.median(r["connect_s"] for r in soft),
            "sigterm_stop_median_s": statistics.median(r["stop_s"] for r in soft),
            "kill9_adopt_phase_median_s": _median_or_none(
                r["start_summary"].get("adopt_phase_s") for r in hard)}


def _median_or_none(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# ---- report ---------------------------------------------------------------------------------
def rows_from(fig: dict) -> list[dict]:
    rows = []

    def row(what, measured, target=None, ok=None):
        rows.append({"what": what, "measured": measured, "target": target or "-",
                     "ok": "-" if ok is None else ("yes" if ok else "NO")})

    ls = fig["ls"]
    floor = ls["python_pass"]["p50_ms"]
    empty = ls["ls_empty_dir"]["p50_ms"]
    row("startup floor: python -c pass p50 (same interpreter, same run)", f"{floor:.1f} ms")
    row("gpumemctl ls --json of an empty directory p50 (the cost of one CLI call)",
        f"{empty:.1f} ms")
    row("  ratio to the startup floor", f"{empty / floor:.2f}x", "<= 2x", empty <= 2 * floor)
    row("  for comparison: python -c 'import gpumemctl.cli.typerapp' p50 (typer's path)",
        f"{ls['import_typer_app']['p50_ms']:.1f} ms")
    row(f"gpumemctl {ls['listing']} ({ls['entries']} entries, {ls['allocations']} allocs) "
        "p50", f"{ls['ls']['p50_ms']:.1f} ms", "<= 150 ms", ls["ls"]["p50_ms"] <= 150)
    row("  same, p90", f"{ls['ls']['p90_ms']:.1f} ms")
    row("  ratio ls p50 / startup floor p50", f"{ls['ls']['p50_ms'] / floor:.1f}x")
    row("  CPU time (user+sys) of the ls process p50 / of python -c pass p50",
        f"{ls['ls_cpu']['p50_ms']:.0f} / {ls['python_pass_cpu']['p50_ms']:.0f} ms")
    row("  breakdown: Client.ls RPC in-process (same listing) p50",
        f"{ls['client_ls_rpc']['p50_ms']:.1f} ms")
    rt = fig["round_trips"]
    t, du = rt["transient_create_rm"], rt["durable_create_rm"]
    row(f"Client create+rm transient 4 KiB p50 (n={t['n']})", f"{t['p50_ms']:.2f} ms",
        "<= 2 ms", t["p50_ms"] <= 2.0)
    row("  same, p99", f"{t['p99_ms']:.2f} ms")
    row(f"  iterations slower than {t['slow_factor']:g}x p50", f"{t['slow_count']}")
    row(f"Client create+rm durable 4 KiB p50 (fsync path, n={du['n']})",
        f"{du['p50_ms']:.2f} ms")
    row("  same, p99", f"{du['p99_ms']:.2f} ms")
    row("  baseline: Client.status round trip p50", f"{rt['status']['p50_ms']:.3f} ms")
    row("  baseline: Client.info (one allocation) round trip p50",
        f"{rt['info']['p50_ms']:.3f} ms")
    rs = fig["restart"]
    n = len(rs["kill9"])
    row(f"restart after kill -9, {N_ALLOCS} durable re-adopted, median of {n}",
        f"{rs['kill9_ready_median_s']:.3f} s", "<= 2 s", rs["kill9_ready_median_s"] <= 2.0)
    row("  of which: spawn -> socket accepts a Client", f"{rs['kill9_connect_median_s']:.3f} s")
    adopt = rs["kill9_adopt_phase_median_s"]
    row(f"  of which: keeper fetch + re-adopt {N_ALLOCS} (daemon log, ms resolution)",
        "?" if adopt is None else f"{adopt:.3f} s")
    row(f"restart after SIGTERM (clean), median of {n}", f"{rs['sigterm_ready_median_s']:.3f} s",
        "<= 2 s", rs["sigterm_ready_median_s"] <= 2.0)
    row("  SIGTERM -> exit (clean stop)", f"{rs['sigterm_stop_median_s']:.3f} s")
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    m = fig["machine"]
    print(f"gpumemctl core benchmark - {m['nproc']} CPU(s), {m['cpu_model']}, "
          f"{m['mem_gib']} GiB RAM, Linux {m['kernel']}, Python {m['python']}, "
          f"/tmp on {m['tmp_fs']}, load average at start {m['loadavg_at_start'][0]}")
    print(f"gpumemd --backend host; total run {fig['wall_s']:.1f} s; "
          f"pattern verified in {len(PATTERN_INDEXES)} allocations after each restart")
    headers = ["what", "measured", "target", "ok?"]
    widths = [max(len(h), *(len(str(r[k])) for r in rows))
              for h, k in zip(headers, ["what", "measured", "target", "ok"], strict=True)]
    line = "  ".join
    print(line(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line("-" * w for w in widths))
    for r in rows:
        cells = [r["what"], r["measured"], r["target"], r["ok"]]
        print(line([cells[0].ljust(widths[0]), cells[1].rjust(widths[1]),
                    cells[2].ljust(widths[2]), cells[3]]).rstrip())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--ls-runs", type=int, default=20, help="timed runs of gpumemctl ls")
    p.add_argument("--iters", type=int, default=2000,
                   help="transient create+rm / status / info iterations")
    p.add_argument("--durable-iters", type=int, default=2000,
                   help="durable create+rm iterations (fsync path)")
    p.add_argument("--restarts", type=int, default=3, help="restarts of each kind")
    p.add_argument("--keep", action="store_true",
                   help="keep the temp dir (daemon log, registry) for inspection")
    args = p.parse_args(argv)

    # A SIGTERM to the benchmark still cleans up (finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = tempfile.mkdtemp(prefix="gpumemctl-bench-", dir="/tmp")
    d = Daemon(base)
    started = time.perf_counter()
    fig: dict = {"machine": machine(), "base_dir": base}
    try:
        say(f"starting gpumemd in {base}")
        c = d.start(timeout=30).client()
        fig["ls"] = phase_ls(d, c, args.ls_runs)
        fig["round_trips"] = phase_round_trips(c, args.iters, args.durable_iters)
        fig["restart"] = phase_restart(d, c, args.restarts)
        fig["wall_s"] = time.perf_counter() - started
    except BaseException:
        show_log_tail(d)
        raise
    finally:
        d.cleanup()
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    rows = rows_from(fig)
    emit(fig, rows, args.json, print_table)
    return 0 if all(r["ok"] != "NO" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
