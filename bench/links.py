#!/usr/bin/env python3
"""What a hard link costs as a file's names grow (issue 24, item 12), and what root's `ls`
waits meanwhile.

    python3 bench/links.py [--names 20000] [--ops 300] [--json]

It starts its own gpumemd (host backend, a FUSE mount) from this checkout in a temp dir and
removes it at the end. For a file with 1 name and then with --names names (made through the
mount), it times --ops links and as many unlinks, through the socket (`Client.link`,
`Client.remove`) and through the mount (os.link, os.unlink), while a child process times
root's `Client.ls("")` every 5 ms on a connection of its own; then `info` of the file; and
once more for the fresh file once the other has its names (what the machine's load and the
daemon's size alone change).
Before issue 24 each link copied the file's list of names (and the socket's answer listed
every name): 37.6 links/s at 20,500 names against 1,896/s on a fresh file.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: small helpers

from gpumemctl import Client  # noqa: E402
from tests import harness  # noqa: E402

LS_EVERY = 0.005          # root's ls: one every 5 ms
TARGET_RATIO = 0.25       # links/s at --names names against a fresh file's, at least


def ls_loop(socket: str, write_fd: int) -> None:
    """In a child: time root's ls until SIGTERM, then write the latencies (JSON)."""
    times: list[float] = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with Client(socket) as c:
        while not stop:
            t = time.perf_counter()
            c.ls("")
            times.append(time.perf_counter() - t)
            time.sleep(LS_EVERY)
    os.write(write_fd, json.dumps(times).encode())
    os._exit(0)


class LsProbe:
    """Root's ls in a child process while the block runs; `.summary` afterwards."""

    def __init__(self, socket: str):
        self.socket = socket
        self.summary: dict = {}

    def __enter__(self):
        self.r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.r)
            ls_loop(self.socket, w)
        os.close(w)
        time.sleep(0.2)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGTERM)
        with os.fdopen(self.r, "rb") as f:
            times = json.loads(f.read() or b"[]")
        os.waitpid(self.pid, 0)
        self.summary = core.summary(times) if times else {}


def rates(d, c: Client, target: str, ops: int, tag: str) -> dict:
    """links/s and unlinks/s of `ops` names of `target`, through the socket and the mount,
    with root's ls timed throughout."""
    out: dict = {}
    with LsProbe(d.socket) as probe:
        t = time.perf_counter()
        for i in range(ops):
            c.link(target, f"s/{tag}{i}")
        out["socket_links_per_s"] = ops / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(ops):
            c.remove(f"s/{tag}{i}")
        out["socket_unlinks_per_s"] = ops / (time.perf_counter() - t)
        src = os.path.join(d.mnt, target)
        t = time.perf_counter()
        for i in range(ops):
            os.link(src, os.path.join(d.mnt, "m", f"{tag}{i}"))
        out["mount_links_per_s"] = ops / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(ops):
            os.unlink(os.path.join(d.mnt, "m", f"{tag}{i}"))
        out["mount_unlinks_per_s"] = ops / (time.perf_counter() - t)
    out["ls"] = probe.summary
    t = time.perf_counter()
    info = c.info(target)
    out["info_ms"] = (time.perf_counter() - t) * 1000
    out["links"] = info["links"]
    return out


def run(names: int, ops: int) -> dict:
    base = tempfile.mkdtemp(prefix="gpumemd-bench-links-", dir="/tmp")
    os.chmod(base, 0o755)
    d = harness.Daemon(base, mount=True, log_level=None,
                       extra_args=["--host-capacity", "1G"])
    try:
        d.start()
        with Client(d.socket) as c:
            for directory in ("s", "m", "many"):
                c.mkdir(directory)
            c.create("fresh", 4096)
            c.create("linked", 4096)
            core.say(f"fresh file: {ops} links and unlinks each way")
            fresh = rates(d, c, "fresh", ops, "f")
            core.say(f"giving 'linked' {names} names through the mount")
            src = os.path.join(d.mnt, "linked")
            for i in range(names - 1):
                os.link(src, os.path.join(d.mnt, "many", f"n{i}"))
            core.say(f"{names} names: {ops} links and unlinks each way")
            many = rates(d, c, "linked", ops, "g")
            core.say("the fresh file again, beside the one with many names")
            beside = rates(d, c, "fresh", ops, "h")
            with LsProbe(d.socket) as quiet:
                time.sleep(2)
        return {"machine": core.machine(), "names": names, "ops": ops,
                "fresh": fresh, "many": many, "beside": beside, "ls_alone": quiet.summary}
    except BaseException:
        core.say("gpumemd log tail:\n" + d.log_tail())
        raise
    finally:
        d.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def table(result: dict) -> list[str]:
    rows = []
    for label, key in (("1 name", "fresh"), (f"{result['names']} names", "many"),
                       ("1 name, after", "beside")):
        r = result[key]
        rows.append({"file": label,
                     **{f"{k.replace('_per_s', '')}/s": f"{r[k]:.0f}" for k in
                        ("socket_links_per_s", "socket_unlinks_per_s", "mount_links_per_s",
                         "mount_unlinks_per_s")},
                     "root ls p50 ms": f"{r['ls'].get('p50_ms', 0):.1f}",
                     "root ls p99 ms": f"{r['ls'].get('p99_ms', 0):.1f}",
                     "info ms": f"{r['info_ms']:.1f}"})
    alone = result["ls_alone"]
    rows.append({"file": "(no links: ls alone)", "socket_links/s": "", "socket_unlinks/s": "",
                 "mount_links/s": "", "mount_unlinks/s": "",
                 "root ls p50 ms": f"{alone.get('p50_ms', 0):.1f}",
                 "root ls p99 ms": f"{alone.get('p99_ms', 0):.1f}", "info ms": ""})
    return core.markdown_table(rows, list(rows[0]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names", type=int, default=20000)
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if harness.fuse_missing():
        sys.exit(f"bench/links.py: {harness.fuse_missing()}")
    result = run(args.names, args.ops)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n".join(table(result)))
    worst = min(result["many"][k] / max(result["fresh"][k], result["beside"][k]) for k in
                ("socket_links_per_s", "mount_links_per_s"))
    print(f"\nlinks/s at {args.names} names / fresh: {worst:.2f} (target >= {TARGET_RATIO})",
          file=sys.stderr)
    return 0 if worst >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
