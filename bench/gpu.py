#!/usr/bin/env python3
"""GPU benchmarks of gpumemd's cuda backend. Run on the GPU machine, from the project's root:

    source .gpu/env.sh; python3 bench/gpu.py            # table on stdout, progress on stderr
    python3 bench/gpu.py --json                         # the same figures as one JSON document

It starts its own `gpumemd --backend cuda` in a fresh /tmp/gpumemctl-gpubench-* directory and,
at the end (also on an error or Ctrl-C), kills it and its keeper and removes that directory and
its files in /dev/shm. Exit status 0 when the run completed (the table marks each target met
or missed; --strict makes a missed target exit 1); a traceback when the benchmark failed.

Rows (bench/README.md):
  1. pinned host<->device copy rate: cuMemcpyHtoD/DtoH of 256 MiB from/to cuMemHostAlloc
     memory, in this process: the yardstick for the data path (target: >= 0.5x of it).
  2. create latency p50/p99 of durable 64 MiB allocations through gpumemctl.Client (cuMemCreate,
     export, keeper deposit, fsynced registry commit: the whole round trip).
  3. attach latency p50: gpumemctl.attach(name, "r") of a 1 GiB allocation (attach request, fd
     import, VA reserve, map, read-only access), after one warm-up attach.
  4. write/read of 4 GiB: the real `gpumemctl write NAME FILE` / `gpumemctl read NAME FILE`
     (a file in /dev/shm), end to end (interpreter and CUDA context start-up included), and the
     same data path in this process (Client.write_from / read_to), which the target is set on.
  5. restart re-adoption of 100 durable allocations: kill -9, then from spawning gpumemd until
     all 100 are ready again, and the adoption phase alone (from the daemon's log).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: the daemon harness and small helpers

from gpumemctl import Client, attach, cudadrv  # noqa: E402
from gpumemctl.protocol import format_size  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
say, pct = core.say, core.pct


gbps = core.gbps


# ---- 1. the yardstick ---------------------------------------------------------------------------
def phase_pinned(index: int, size: int = 256 * MiB, reps: int = 8) -> dict:
    """Plain pinned copies in this process, synchronous, one 256 MiB buffer at a time."""
    say("pinned copy baseline")
    gran = cudadrv.granularity(index)
    cap = -(-size // gran) * gran
    handle = cudadrv.mem_create(cap, index)
    mapping = cudadrv.Mapping(handle, cap, index, writable=True)
    buf = cudadrv.PinnedBuffer(size, index)
    try:
        with cudadrv.context(index):
            for _ in range(2):                                   # warm up both directions
                cudadrv.memcpy_htod(mapping.ptr, buf.ptr, size)
                cudadrv.memcpy_dtoh(buf.ptr, mapping.ptr, size)
            t0 = time.perf_counter()
            for _ in range(reps):
                cudadrv.memcpy_htod(mapping.ptr, buf.ptr, size)
            h2d = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(reps):
                cudadrv.memcpy_dtoh(buf.ptr, mapping.ptr, size)
            d2h = time.perf_counter() - t0
    finally:
        buf.free()
        mapping.close()
    return {"h2d_gbps": gbps(size * reps, h2d), "d2h_gbps": gbps(size * reps, d2h),
            "bytes_per_copy": size}


# ---- 2. create latency --------------------------------------------------------------------------
def phase_create(c: Client, n: int, size: int) -> dict:
    say(f"create latency: {n} durable {size >> 20} MiB allocations")
    for i in range(5):                                           # warm-up
        c.create(f"warm/{i}", size, durable=True)
    c.remove("warm", recursive=True)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        c.create(f"create/a{i:04d}", size, durable=True)
        times.append(time.perf_counter() - t0)
    c.remove("create", recursive=True)
    return {"n": n, "size": size, "p50_s": pct(times, 50), "p99_s": pct(times, 99),
            "max_s": max(times)}


# ---- 3. attach latency --------------------------------------------------------------------------
def phase_attach(d: core.Daemon, c: Client, n: int) -> dict:
    say(f"attach latency: {n} attach/detach cycles of a 1 GiB allocation")
    c.create("attach/x", GiB)
    attach("attach/x", "r", d.socket).detach()                   # warm-up: CUDA context
    times, detach_times = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        a = attach("attach/x", "r", d.socket)
        t1 = time.perf_counter()
        a.detach()
        times.append(t1 - t0)
        detach_times.append(time.perf_counter() - t1)
    c.remove("attach/x")
    return {"n": n, "p50_s": pct(times, 50), "p99_s": pct(times, 99),
            "detach_p50_s": pct(detach_times, 50)}


# ---- 4. write / read ----------------------------------------------------------------------------
def make_file(path: str, size: int) -> str:
    """`size` bytes: a 64 MiB random block repeated, with each block's index stamped in."""
    block = bytearray(os.urandom(64 * MiB))
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(0, size, len(block)):
            block[:8] = i.to_bytes(8, "little")
            part = block[:min(len(block), size - i)]
            f.write(part)
            digest.update(part)
    return digest.hexdigest()


sha256_file = core.file_sha256


def cli(d: core.Daemon, *args: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(core.console_script("gpumemctl") + ["--socket", d.socket, *args],
                          stdin=subprocess.DEVNULL, capture_output=True, env=core.clean_env())
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"gpumemctl {' '.join(args)} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')}")
    return took


def phase_io(d: core.Daemon, c: Client, size: int, shm: str) -> dict:
    src, dst = os.path.join(shm, "in.bin"), os.path.join(shm, "out.bin")
    say(f"write/read: making a {format_size(size)} file in {shm}")
    want = make_file(src, size)
    c.create("io/x", size)
    say("write/read: gpumemctl write / read (end to end)")
    cli_write = cli(d, "write", "io/x", src)
    cli_read = cli(d, "read", "io/x", dst)
    if sha256_file(dst) != want:
        raise RuntimeError("gpumemctl read did not return what gpumemctl write wrote")
    os.unlink(dst)
    floor = min(cli(d, "read", "io/x", "--length", "1", "/dev/null") for _ in range(3))
    say("write/read: the same data path in this process")
    c.read("io/x", 0, 1)                                         # warm-up: CUDA context
    runs = {"write": [], "read_file": [], "read_null": []}
    for _ in range(3):
        with open(src, "rb") as f:
            t0 = time.perf_counter()
            c.write_from("io/x", f, total=size)
            runs["write"].append(time.perf_counter() - t0)
        with open(dst, "wb") as f:
            t0 = time.perf_counter()
            c.read_to("io/x", f)
            runs["read_file"].append(time.perf_counter() - t0)
        os.unlink(dst)
        with open(os.devnull, "wb") as f:
            t0 = time.perf_counter()
            c.read_to("io/x", f)
            runs["read_null"].append(time.perf_counter() - t0)
    c.remove("io/x")
    runs.update(tmpfs_baseline(src, dst, size))
    os.unlink(src)
    best = {k: min(v) for k, v in runs.items()}
    return {"size": size, "cli_write_s": cli_write, "cli_read_s": cli_read,
            "cli_floor_s": floor,
            "cli_write_gbps": gbps(size, cli_write), "cli_read_gbps": gbps(size, cli_read),
            "write_gbps": gbps(size, best["write"]),
            "read_file_gbps": gbps(size, best["read_file"]),
            "read_null_gbps": gbps(size, best["read_null"]),
            "tmpfs_read_gbps": gbps(size, best["tmpfs_read"]),
            "tmpfs_write_gbps": gbps(size, best["tmpfs_write"]), "verified": True}


def tmpfs_baseline(src: str, dst: str, size: int) -> dict:
    """The file side alone, with the same parallel pread/pwrite pieces the client uses:
    file -> ordinary memory, and memory -> a new file. A GPU path cannot beat these."""
    from gpumemctl.memory import _parallel, _pread_full, _pwrite_full
    buf = memoryview(bytearray(size))
    out = {"tmpfs_read": [], "tmpfs_write": []}
    for _ in range(3):
        fd = os.open(src, os.O_RDONLY)
        t0 = time.perf_counter()
        _parallel(_pread_full, buf, fd, 0)
        out["tmpfs_read"].append(time.perf_counter() - t0)
        os.close(fd)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        t0 = time.perf_counter()
        _parallel(_pwrite_full, buf, fd, 0)
        out["tmpfs_write"].append(time.perf_counter() - t0)
        os.close(fd)
        os.unlink(dst)
    return out


# ---- 5. restart re-adoption ---------------------------------------------------------------------
def phase_restart(d: core.Daemon, c: Client, n: int, size: int) -> dict:
    say(f"restart: {n} durable {size >> 20} MiB allocations, then kill -9")
    for i in range(n):
        c.create(f"restart/a{i:03d}", size, durable=True)
    c.write("restart/a000", b"first")
    c.write(f"restart/a{n - 1:03d}", b"last")
    c.close()
    d.kill9()
    t_spawn = d.spawn()
    c = d.connect(timeout=120)
    t_conn = time.perf_counter() - t_spawn
    while True:
        entries = c.ls("restart")
        if sum(e["state"] == "ready" for e in entries) == n:
            break
        if time.perf_counter() - t_spawn > 120:
            raise RuntimeError("not all durable allocations were re-adopted within 120 s")
        time.sleep(0.005)
    t_ready = time.perf_counter() - t_spawn
    if c.read("restart/a000", 0, 5) != b"first" or \
            c.read(f"restart/a{n - 1:03d}", 0, 4) != b"last":
        raise RuntimeError("data changed across the restart")
    summary = d.last_start_summary() or {}
    if summary.get("adopted") != n:
        raise RuntimeError(f"the restart adopted {summary.get('adopted')}, expected {n}")
    c.remove("restart", recursive=True)
    c.close()
    d.note_keeper()
    return {"n": n, "size": size, "connect_s": t_conn, "ready_s": t_ready,
            "adopt_phase_s": summary.get("adopt_phase_s")}


# ---- report -------------------------------------------------------------------------------------
def rows_from(fig: dict) -> list[dict]:
    pin, io, cr, at, rs = (fig["pinned"], fig["io"], fig["create"], fig["attach"],
                           fig["restart"])
    half_h2d, half_d2h = pin["h2d_gbps"] / 2, pin["d2h_gbps"] / 2

    def ok(value, target):
        return "yes" if value >= target else "NO"

    ms = lambda s: f"{s * 1e3:.2f} ms"                      # noqa: E731
    adopt = rs["adopt_phase_s"]
    return [
        {"what": "pinned copy host->device (cuMemcpyHtoD, 256 MiB)",
         "measured": f"{pin['h2d_gbps']:.1f} GB/s", "target": "yardstick", "ok": ""},
        {"what": "pinned copy device->host (cuMemcpyDtoH, 256 MiB)",
         "measured": f"{pin['d2h_gbps']:.1f} GB/s", "target": "yardstick", "ok": ""},
        {"what": f"create durable {cr['size'] >> 20} MiB p50 (n={cr['n']})",
         "measured": ms(cr["p50_s"]), "target": "", "ok": ""},
        {"what": f"create durable {cr['size'] >> 20} MiB p99",
         "measured": ms(cr["p99_s"]), "target": "", "ok": ""},
        {"what": f"attach 1 GiB read-only p50 (n={at['n']})", "measured": ms(at["p50_s"]),
         "target": "", "ok": ""},
        {"what": "detach p50", "measured": ms(at["detach_p50_s"]), "target": "", "ok": ""},
        {"what": f"write {format_size(io['size'])} file->GPU (Client.write_from)",
         "measured": f"{io['write_gbps']:.1f} GB/s", "target": f">= {half_h2d:.1f} GB/s",
         "ok": ok(io["write_gbps"], half_h2d)},
        {"what": f"read {format_size(io['size'])} GPU->file (Client.read_to)",
         "measured": f"{io['read_file_gbps']:.1f} GB/s", "target": f">= {half_d2h:.1f} GB/s",
         "ok": ok(io["read_file_gbps"], half_d2h)},
        {"what": f"baseline: tmpfs file -> memory, {format_size(io['size'])} (same pieces)",
         "measured": f"{io['tmpfs_read_gbps']:.1f} GB/s", "target": "yardstick", "ok": ""},
        {"what": f"baseline: memory -> new tmpfs file, {format_size(io['size'])}",
         "measured": f"{io['tmpfs_write_gbps']:.1f} GB/s", "target": "yardstick", "ok": ""},
        {"what": f"read {format_size(io['size'])} GPU->/dev/null (Client.read_to)",
         "measured": f"{io['read_null_gbps']:.1f} GB/s", "target": "", "ok": ""},
        {"what": "gpumemctl write FILE, end to end",
         "measured": f"{io['cli_write_gbps']:.1f} GB/s", "target": "", "ok": ""},
        {"what": "gpumemctl read FILE, end to end",
         "measured": f"{io['cli_read_gbps']:.1f} GB/s", "target": "", "ok": ""},
        {"what": "gpumemctl read 1 byte (start-up floor)", "measured": ms(io["cli_floor_s"]),
         "target": "", "ok": ""},
        {"what": f"kill -9 restart: {rs['n']} durable ready again",
         "measured": ms(rs["ready_s"]), "target": "", "ok": ""},
        {"what": "  of which the adoption phase (log)",
         "measured": ms(adopt) if adopt is not None else "n/a", "target": "", "ok": ""},
    ]


def print_table(fig: dict, rows: list[dict]) -> None:
    g = fig["gpu"]
    print(f"gpumemctl GPU benchmark - device {g['index']} {g['name']} ({g['uuid']}), CUDA "
          f"driver {g['driver']}, {core.machine()['nproc']} CPUs; total run {fig['wall_s']:.1f} s")
    headers = ["what", "measured", "target", "ok?"]
    keys = ["what", "measured", "target", "ok"]
    widths = [max(len(h), *(len(str(r[k])) for r in rows))
              for h, k in zip(headers, keys, strict=True)]
    cells = (h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print("  ".join(cells))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join([r["what"].ljust(widths[0]), r["measured"].rjust(widths[1]),
                         r["target"].ljust(widths[2]), r["ok"]]).rstrip())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--creates", type=int, default=200, help="durable creates timed")
    p.add_argument("--create-size", default=64 * MiB, type=int, help="bytes per create")
    p.add_argument("--attaches", type=int, default=50, help="attach/detach cycles timed")
    p.add_argument("--io-size", type=int, default=4 * GiB, help="bytes written and read")
    p.add_argument("--restart-allocs", type=int, default=100)
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (daemon log)")
    args = p.parse_args(argv)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = tempfile.mkdtemp(prefix="gpumemctl-gpubench-", dir="/tmp")
    shm = tempfile.mkdtemp(prefix="gpumemctl-gpubench-", dir="/dev/shm")
    d = core.Daemon(base, backend="cuda")
    started = time.perf_counter()
    index = args.device
    fig: dict = {"gpu": {"index": index, "name": cudadrv.device_name(index),
                         "uuid": cudadrv.device_uuid(index),
                         "driver": "{}.{}".format(*cudadrv.driver_version())}}
    try:
        fig["pinned"] = phase_pinned(index)
        say(f"starting gpumemd --backend cuda in {base}")
        c = d.start(timeout=120).client()
        fig["create"] = phase_create(c, args.creates, args.create_size)
        fig["attach"] = phase_attach(d, c, args.attaches)
        fig["io"] = phase_io(d, c, args.io_size, shm)
        fig["restart"] = phase_restart(d, c, args.restart_allocs, 64 * MiB)
        fig["wall_s"] = time.perf_counter() - started
    except BaseException:
        core.show_log_tail(d)
        raise
    finally:
        d.cleanup()
        shutil.rmtree(shm, ignore_errors=True)
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    rows = rows_from(fig)
    core.emit(fig, rows, args.json, print_table)
    missed = any(r["ok"] == "NO" for r in rows)
    return 1 if (missed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
