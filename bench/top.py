#!/usr/bin/env python3
"""How long a refresh of `gpumemctl top` takes with 1000 allocations (issue 6: < 100 ms).

    .venv/bin/python bench/top.py [--allocations 1000] [--runs 30] [--backend cuda] [--json]

Starts its own gpumemd (host backend, or cuda on a GPU machine) in a temp dir, creates N
allocations in ONE directory (the worst case: all N rows are on screen), then runs the app headless
(Textual's run_test, 120x40) and times, per refresh:
  fetch      DaemonSource.snapshot(): `status` + `ls -R` over the socket (the baseline:
             the RPCs the refresh cannot avoid), on the worker thread in the real app;
  draw       the app's draw() of that snapshot (every panel updated);
  paint      the event loop's work to repaint the screen: CPU time of its thread during
             Pilot's pause, less that of a pause with nothing to repaint (same run); the
             pause's wall time is mostly Pilot waiting for its frame timer, not work;
for three cases: nothing changed, one allocation changed (its holders), and a full
rebuild (the sort order changed). A refresh = fetch + draw. Table on stdout, progress on
stderr; the temp dir, daemon and keeper are removed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: the daemon harness

from gpumemctl import Client  # noqa: E402
from tui import make_app  # noqa: E402
from tui.source import DaemonSource  # noqa: E402

TARGET_MS = 100.0


say = core.say


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def measure(sock: str, runs: int, n: int) -> dict[str, list[float]]:
    """Per case: fetch and draw (wall clock), and the CPU time the event loop's thread
    spends in the pause that repaints (Pilot's pause mostly waits for its frame timer, so
    its wall time says little). `idle` is the CPU of a pause with nothing to repaint."""
    source = DaemonSource(sock)
    app = make_app(source=source, live=False)
    times: dict[str, list[float]] = {}

    def note(key: str, ms: float) -> None:
        times.setdefault(key, []).append(ms)

    async with app.run_test(size=(120, 40)) as pilot:
        while app.snapshot is None or len(app.snapshot.entries) < n:
            await pilot.pause(0.05)
        panel = app.main.query_one("#allocations")
        panel.enter("many")
        await pilot.pause()
        with Client(sock) as c:
            for i in range(runs):
                cpu = time.thread_time()
                await pilot.pause()
                note("idle", (time.thread_time() - cpu) * 1000)
                for case in CASES:
                    holder = c.open(f"many/a{i % n:04d}", "r") if case == "one" else None
                    if case == "rebuild":
                        panel.reverse = not panel.reverse    # the order of all rows changes
                    start = time.perf_counter()
                    snap = source.snapshot()
                    fetched = time.perf_counter()
                    app.draw(snap)
                    drawn, cpu = time.perf_counter(), time.thread_time()
                    await pilot.pause()                      # the repaint
                    done = time.thread_time() - cpu
                    if holder is not None:
                        holder.close()
                    note("fetch", (fetched - start) * 1000)
                    note(case + ".draw", (drawn - fetched) * 1000)
                    note(case + ".pause", done * 1000)
        rows = app.main.query_one("#alloc-table").row_count
        assert rows == n, f"the table shows {rows} rows, expected {n}"
    return times


CASES = {"same": "nothing changed", "one": "one row changed", "rebuild": "all rows reordered"}


def report(times: dict[str, list[float]], n: int, runs: int, as_json: bool) -> bool:
    med = {k: statistics.median(v) for k, v in times.items()}
    fetch, idle = med["fetch"], med["idle"]
    rows = []
    for case, label in CASES.items():
        paint = max(0.0, med[case + ".pause"] - idle)
        total = fetch + med[case + ".draw"] + paint
        rows.append({"case": label, "fetch_ms": fetch, "draw_ms": med[case + ".draw"],
                     "paint_ms": paint, "refresh_ms": total,
                     "refresh_p95_ms": pct(times["fetch"], 0.95) +
                     pct(times[case + ".draw"], 0.95) + paint,
                     "vs_fetch": total / fetch, "target_met": total < TARGET_MS})
    if as_json:
        print(json.dumps({"allocations": n, "runs": runs, "idle_pause_cpu_ms": idle,
                          "rows": rows}))
    else:
        print(f"gpumemctl top, {n} allocations on screen, 120x40; {os.cpu_count()} CPUs "
              f"{platform.machine()}, Python {platform.python_version()}; median of {runs}; "
              f"paint = CPU of the repaint, less an idle pause's ({idle:.1f} ms)")
        print(f"{'refresh':<20} {'fetch ms':>9} {'draw ms':>8} {'paint ms':>9} "
              f"{'total ms':>9} {'p95 ms':>7} {'total/fetch':>12}  target < {TARGET_MS:.0f} ms")
        for r in rows:
            print(f"{r['case']:<20} {r['fetch_ms']:>9.1f} {r['draw_ms']:>8.1f} "
                  f"{r['paint_ms']:>9.1f} {r['refresh_ms']:>9.1f} {r['refresh_p95_ms']:>7.1f} "
                  f"{r['vs_fetch']:>11.2f}x  {'met' if r['target_met'] else 'MISSED'}")
    return all(r["target_met"] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocations", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--backend", choices=("host", "cuda"), default="host",
                    help="cuda: on a GPU machine, so `status` carries NVML telemetry")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="gpumemctl-bench-tui-")
    d = core.Daemon(base, backend=args.backend, extra_args=["--host-capacity", "64G"])
    sock = d.socket
    try:
        d.start(timeout=30)
        say(f"creating {args.allocations} allocations in one directory")
        with Client(sock) as c:
            for i in range(args.allocations):
                c.create(f"many/a{i:04d}", 4096, ecc="none")
        say(f"{args.runs} refreshes of each kind")
        times = asyncio.run(measure(sock, args.runs, args.allocations))
    finally:
        d.stop()
        d.cleanup()                 # the keeper, and gpumemd if it did not stop
        shutil.rmtree(base, ignore_errors=True)
    if not args.json:
        print(f"backend {args.backend}")
    return 0 if report(times, args.allocations, args.runs, args.json) else 1


if __name__ == "__main__":
    sys.exit(main())
