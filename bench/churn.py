#!/usr/bin/env python3
"""Root's latency while another uid churns connections (issue 24, item 10): uid 65534 holds
every connection its max_connections_per_uid allows, then connects and hangs up in a tight
loop from several processes and threads (tests/churn.py); root's `Client().ls("")`, a new
connection each, is timed alone and during the churn, in the same run.

    sudo .venv/bin/python bench/churn.py [--seconds 10] [--processes 4] [--threads 8]
                                         [--hello] [--json]

Needs root (the churn runs as uid 65534). Starts its own gpumemd (host backend) in a temp
dir and removes it. `--hello`: each churned connection also sends a hello before it hangs
up. The table gives root's p50/p99/max alone and during the churn, the churn's rate, and the
target: root's p99 under 50 ms during the churn.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: the daemon harness

from tests import churn  # noqa: E402

TARGET_P99_MS = 50.0
PER_UID = 64


def run(args) -> tuple[dict, list[dict]]:
    base = tempfile.mkdtemp(prefix="gpumemd-bench-churn-", dir="/tmp")
    os.chmod(base, 0o755)
    config = os.path.join(base, "gpumemd.toml")
    with open(config, "w") as f:
        f.write(f"max_connections_per_uid = {PER_UID}\n")
    d = core.Daemon(base, extra_args=["--config", config])
    try:
        d.start()
        core.say(f"baseline: root alone for {args.seconds:.0f} s")
        quiet = churn.root_ls(d.socket, time.monotonic() + args.seconds)
        core.say(f"churn: uid {churn.CHURNER} from {args.processes} processes x "
                 f"{args.threads} threads for {args.seconds:.0f} s")
        result = churn.churn(d.socket, args.seconds, 0 if args.under_cap else PER_UID,
                             args.processes, args.threads, hello=args.hello)
        alive = d.proc is not None and d.proc.poll() is None
        log_lines = len(d.log().splitlines())
    finally:
        d.cleanup()
        shutil.rmtree(base, ignore_errors=True)
    rows = [{"phase": "root alone", **core.summary(quiet["times"]),
             "failed": quiet["failed"]},
            {"phase": "root during churn", **core.summary(result["root"]["times"]),
             "failed": result["root"]["failed"]}]
    fig = {"machine": core.machine(), "seconds": args.seconds, "processes": args.processes,
           "threads": args.threads, "hello": args.hello, "per_uid": PER_UID,
           "churn_connects": result["connects"],
           "churn_connects_per_s": result["connects_per_s"],
           "holder": result["workers"].get("holder"), "daemon_alive": alive,
           "daemon_log_lines": log_lines, "root_errors": result["root"]["errors"][:5]}
    return fig, rows


def print_table(fig: dict, rows: list[dict]) -> None:
    print(f"root's Client().ls(\"\"), a new connection each, every 10 ms "
          f"({fig['machine']['nproc']} cores; churn: uid {churn.CHURNER}, "
          f"{fig['processes']}x{fig['threads']} workers{', hello' if fig['hello'] else ''}, "
          f"{fig['seconds']:.0f} s)")
    print(f"{'phase':20} {'calls':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in rows:
        print(f"{r['phase']:20} {r['n']:>6} {r['failed']:>6} {r['p50_ms']:>8.2f} "
              f"{r['p99_ms']:>8.2f} {r['max_ms']:>8.1f}")
    met = "met" if rows[1]["p99_ms"] < TARGET_P99_MS else "NOT met"
    print(f"churn: {fig['churn_connects']} connects ({fig['churn_connects_per_s']:.0f}/s), "
          f"holder {fig['holder']}; target p99 < {TARGET_P99_MS:.0f} ms during churn: {met}")
    print(f"daemon alive {fig['daemon_alive']}, its log {fig['daemon_log_lines']} lines")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--hello", action="store_true")
    ap.add_argument("--under-cap", action="store_true",
                    help="no connections held first: the churn stays under the uid's cap")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/churn.py needs root: the churn runs as another uid", file=sys.stderr)
        return 2
    fig, rows = run(args)
    core.emit(fig, rows, args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
