#!/usr/bin/env python3
"""Sleep and wake (issue 28, part 1): what `sleep` and `wake` of a large allocation cost, against
the pinned copies of the same size in the same run.

    source .gpu/env.sh; python3 bench/sleep.py                               # GPU machine, 16 GiB
    python3 bench/sleep.py --backend host --size 256M    # any machine
    python3 bench/sleep.py --json              # the same figures as one JSON document

It starts its own gpumemd (the console script next to this interpreter, through bench/core.py's
harness) in a fresh /tmp/gpumemctl-sleepbench-* directory and removes it at the end, also on an
error, Ctrl-C or SIGTERM (gpumemd and its keeper killed; --keep keeps the directory with the
daemon's log). Progress goes to stderr; only the table (or the JSON) goes to stdout. Exit
status 0 when the run completed, 1 when a check failed (bytes changed by a sleep and wake, an
address moved, a state not the one expected) or the run did (the error and the end of
gpumemd's log on stderr), 130 on Ctrl-C. What each row means: bench/README.md.

  1. The yardsticks, in this process, before the allocation exists: on cuda one
     cuMemcpyDtoH and one cuMemcpyHtoD of --size between a cuMemHostAlloc buffer and a VMM
     mapping (best of 2; the pinning of the buffer timed on its own); on host one numpy copy
     of --size into fresh pages and one into pages already touched.
  2. A durable (--transient: transient) allocation of --size, filled with a repeated random
     block through Client.write_from.
  3. --runs cycles, nothing attached: Client.sleep then Client.wake, each timed from this
     process (wall) beside the `seconds` the daemon reports; the device's free memory (the
     driver's cuMemGetInfo on cuda, and the daemon's own account) awake, asleep and woken;
     the wake's parity check; samples of the bytes read back after each wake.
  4. --runs cycles with the allocation attached here (gpumemctl.attach, read-only; not with
     --no-attach): the sleep parks the attachment, the wake maps new memory at the same
     address (the remap); the address is checked unchanged and the samples read through it.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

import core  # noqa: E402  bench/core.py: the daemon harness and small helpers
import fs  # noqa: E402  bench/fs.py: the machine with its GPU (nvidia-smi)

from gpumemctl.protocol import UsageError, format_size, parse_size  # noqa: E402
from tests import harness  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
NAME = "sleepbench/a"
BLOCK = 64 * MiB + 12345        # the fill: random bytes of this length, over and over
SAMPLE = 1 * MiB                # bytes compared at each sample offset
say, gbps = core.say, core.gbps


class Failed(RuntimeError):
    """A check failed, or the benchmark itself did."""


# ---- the bytes ------------------------------------------------------------------------------
class Pattern(io.RawIOBase):
    """`size` bytes of one random block repeated: the byte at offset o is block[o % len]."""

    def __init__(self, size: int, block: bytes):
        self.size, self.block, self.pos = size, memoryview(block), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), self.size - self.pos)
        done = 0
        while done < n:
            at = (self.pos + done) % len(self.block)
            k = min(n - done, len(self.block) - at)
            view[done:done + k] = self.block[at:at + k]
            done += k
        self.pos += n
        return n

    def expect(self, offset: int, length: int) -> bytes:
        out = bytearray(length)
        saved, self.pos = self.pos, offset
        self.readinto(out)
        self.pos = saved
        return bytes(out)


def samples(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the ranges compared after each wake: the start, two inside, the
    end."""
    n = min(SAMPLE, size)
    return sorted({(0, n), (size // 3, min(n, size - size // 3)),
                   (size // 2 + 777, min(n, max(0, size - size // 2 - 777))),
                   (size - n, n)})


def check_samples(read, pattern: Pattern, size: int, what: str) -> None:
    for off, n in samples(size):
        if n and read(off, n) != pattern.expect(off, n):
            raise Failed(f"{what}: the {format_size(n)} at offset {off} differ from what was "
                         "written")


# ---- the yardsticks -------------------------------------------------------------------------
def yardstick_cuda(size: int, device: int, runs: int = 2) -> dict:
    """One synchronous copy of `size` each way between pinned host memory and a VMM mapping,
    best of `runs`; the pinning (cuMemHostAlloc) of the buffer timed on its own."""
    from gpumemctl import cudadrv
    cudadrv.init()
    gran = cudadrv.granularity(device)
    cap = -(-size // gran) * gran
    mapping = cudadrv.Mapping(cudadrv.mem_create(cap, device), cap, device, writable=True)
    buf = None
    try:
        t0 = time.perf_counter()
        buf = cudadrv.PinnedBuffer(size, device)
        pin_s = time.perf_counter() - t0
        h2d, d2h = [], []
        with cudadrv.context(device):
            warm = min(size, 256 * MiB)
            cudadrv.memcpy_htod(mapping.ptr, buf.ptr, warm)
            cudadrv.memcpy_dtoh(buf.ptr, mapping.ptr, warm)
            cudadrv.ctx_synchronize()
            for _ in range(runs):
                t0 = time.perf_counter()
                cudadrv.memcpy_dtoh(buf.ptr, mapping.ptr, size)
                cudadrv.ctx_synchronize()
                d2h.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cudadrv.memcpy_htod(mapping.ptr, buf.ptr, size)
                cudadrv.ctx_synchronize()
                h2d.append(time.perf_counter() - t0)
    finally:
        if buf is not None:
            buf.free()
        mapping.close()
    return {"what": "pinned copy (cuMemcpy, one copy of --size)", "pin_s": pin_s,
            "d2h_s": min(d2h), "h2d_s": min(h2d), "d2h_gbps": gbps(size, min(d2h)),
            "h2d_gbps": gbps(size, min(h2d)), "d2h_runs": d2h, "h2d_runs": h2d}


def yardstick_host(size: int, runs: int = 2) -> dict:
    """numpy copies of `size` bytes: into fresh pages (first touch, as a new memfd's), then
    into the same pages again, best of `runs`."""
    import numpy as np
    src = np.empty(size, np.uint8)
    src.fill(7)
    dst = np.empty(size, np.uint8)
    t0 = time.perf_counter()
    np.copyto(dst, src)
    fresh_s = time.perf_counter() - t0
    warm = []
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        warm.append(time.perf_counter() - t0)
    del src, dst
    best = min(warm)
    return {"what": "memcpy (numpy copyto of --size)", "fresh_s": fresh_s,
            "fresh_gbps": gbps(size, fresh_s), "d2h_s": best, "h2d_s": best,
            "d2h_gbps": gbps(size, best), "h2d_gbps": gbps(size, best), "runs": warm}


# ---- free memory ----------------------------------------------------------------------------
def memory(c, uuid: str, device: int, cuda: bool) -> dict:
    """The daemon's account of the device (free, ours) and, on cuda, the driver's free bytes
    as this process sees them (every process's memory counted)."""
    dev = next((x for x in c.devices() if x["uuid"] == uuid), None)
    out = {"daemon_free": dev["free"] if dev else None, "ours": dev["ours"] if dev else None}
    if cuda:
        from gpumemctl import cudadrv
        out["driver_free"] = cudadrv.mem_get_info(device)[0]
    return out


# ---- the cycles -----------------------------------------------------------------------------
def first(reply) -> dict:
    """The one reply of a call about one name (the library answers a list)."""
    if isinstance(reply, list):
        if len(reply) != 1:
            raise Failed(f"one reply expected for {NAME}, got {len(reply)}")
        reply = reply[0]
    return dict(reply)


def cycle(c, cfg: dict, pattern: Pattern, attachment=None) -> dict:
    """One sleep and one wake of NAME, timed, with the checks."""
    uuid, device, cuda = cfg["uuid"], cfg["device"], cfg["backend"] == "cuda"
    awake = memory(c, uuid, device, cuda)
    t0 = time.perf_counter()
    slept = first(c.sleep(NAME))
    sleep_wall = time.perf_counter() - t0
    state = c.info(NAME)["state"]
    if state != "asleep":
        raise Failed(f"after Client.sleep, {NAME} is {state}, not asleep")
    asleep = memory(c, uuid, device, cuda)
    t0 = time.perf_counter()
    woke = first(c.wake(NAME))
    wake_wall = time.perf_counter() - t0
    state = c.info(NAME)["state"]
    if state != "ready":
        raise Failed(f"after Client.wake, {NAME} is {state}, not ready")
    woken = memory(c, uuid, device, cuda)
    verify = woke.get("verify") or {}
    if verify.get("uncorrectable"):
        raise Failed(f"the wake found {verify['uncorrectable']} uncorrectable blocks: {verify}")
    if attachment is not None:
        if attachment.ptr != cfg["ptr"]:
            raise Failed(f"the attachment moved from {cfg['ptr']:#x} to {attachment.ptr:#x}")
        check_samples(attachment.read, pattern, cfg["size"], "through the attachment")
    else:
        check_samples(lambda off, n: c.read(NAME, off, n), pattern, cfg["size"],
                      "read after the wake")
    return {"sleep_wall_s": sleep_wall, "sleep_s": slept.get("seconds"),
            "sleep_bytes": slept.get("bytes"), "wake_wall_s": wake_wall,
            "wake_s": woke.get("seconds"), "wake_bytes": woke.get("bytes"),
            "verify": verify, "awake": awake, "asleep": asleep, "woken": woken,
            "sleep_phases": slept.get("phases") or {}, "wake_phases": woke.get("phases") or {}}


def phase_cycles(d: core.Daemon, cfg: dict, pattern: Pattern, attached: bool) -> list[dict]:
    import gpumemctl
    runs, out = cfg["runs"], []
    with d.client() as c:
        a = gpumemctl.attach(NAME, "r", d.socket) if attached else None
        try:
            if a is not None:
                cfg["ptr"] = a.ptr
                check_samples(a.read, pattern, cfg["size"], "through the attachment")
            for n in range(runs):
                say(f"sleep and wake, {'attached' if attached else 'not attached'}, "
                    f"run {n + 1}/{runs}")
                out.append(cycle(c, cfg, pattern, a))
        finally:
            if a is not None:
                a.detach(seal=False)
    return out


def run_all(d: core.Daemon, fig: dict) -> None:
    cfg = fig["config"]
    size, cuda = cfg["size"], cfg["backend"] == "cuda"
    if cuda:
        say(f"yardstick: pinned copies of {format_size(size)} each way")
        fig["yardstick"] = yardstick_cuda(size, cfg["device"])
    else:
        say(f"yardstick: memcpy of {format_size(size)}")
        fig["yardstick"] = yardstick_host(size)
    say(f"starting gpumemd --backend {cfg['backend']} in {d.base}")
    try:
        d.start(timeout=120)
    except AssertionError as exc:      # the harness's: gpumemd exited, or never served
        raise Failed(f"gpumemd --backend {cfg['backend']} did not start: {exc}") from None
    pattern = Pattern(size, os.urandom(min(BLOCK, size)))
    with d.client() as c:
        c.mkdir("sleepbench", parents=True)
        info = c.create(NAME, size, durable=cfg["durable"], ecc=cfg["ecc"],
                        device=cfg["device"] if cuda else None)
        cfg["uuid"], cfg["ecc"] = info["device"], info["ecc"]
        say(f"filling {format_size(size)}")
        t0 = time.perf_counter()
        c.write_from(NAME, pattern)
        fig["fill_s"] = time.perf_counter() - t0
    fig["plain"] = phase_cycles(d, cfg, pattern, attached=False)
    if cfg["attach"]:
        fig["attached"] = phase_cycles(d, cfg, pattern, attached=True)
    with d.client() as c:
        c.remove(NAME)


# ---- report ---------------------------------------------------------------------------------
def med(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def med_rest(runs: list[dict], step: str) -> float | None:
    """Median of wall - the daemon's seconds: what the call costs besides the daemon's work
    (the round trip, and for an attachment the park or the remap in this process)."""
    values = [r[f"{step}_wall_s"] - r[f"{step}_s"] for r in runs if r.get(f"{step}_s")
              is not None]
    return statistics.median(values) if values else None


def rows_from(fig: dict) -> list[dict]:
    rows: list[dict] = []
    cfg, y = fig["config"], fig["yardstick"]
    size, cuda = cfg["size"], cfg["backend"] == "cuda"

    def row(step, nbytes=None, seconds=None, base=None):
        rate = gbps(nbytes, seconds) if nbytes and seconds else None
        rows.append({"step": step, "bytes": format_size(nbytes) if nbytes else "-",
                     "seconds": "-" if seconds is None else f"{seconds:.4f}" if seconds < 0.1
                     else f"{seconds:.3f}",
                     "GB/s": f"{rate:.2f}" if rate else "-",
                     "ratio": f"{rate / base:.2f}x" if rate and base else "-"})

    d2h, h2d = y["d2h_gbps"], y["h2d_gbps"]
    if cuda:
        row("yardstick: pinned copy device->host (cuMemcpyDtoH)", size, y["d2h_s"], d2h)
        row("yardstick: pinned copy host->device (cuMemcpyHtoD)", size, y["h2d_s"], h2d)
        row("  pinning the host buffer (cuMemHostAlloc), not in the copies", size, y["pin_s"])
    else:
        row("yardstick: memcpy, pages already touched", size, y["d2h_s"], d2h)
        row("  memcpy into fresh pages (first touch)", size, y["fresh_s"], d2h)
    row("fill: Client.write_from", size, fig["fill_s"], h2d)
    kinds = [("plain", "not attached")] + ([("attached", "attached here")]
                                           if fig.get("attached") else [])
    for key, label in kinds:
        runs = fig[key]
        moved = med(runs, "sleep_bytes") or size
        for step, base, what in (("sleep", d2h, "park" if key == "attached" else None),
                                 ("wake", h2d, "remap" if key == "attached" else None)):
            call = f"Client.{step}"
            row(f"{step}, {label}: {call}, wall (median of {len(runs)})", moved,
                med(runs, f"{step}_wall_s"), base)
            row("  the daemon's own seconds", moved, med(runs, f"{step}_s"), base)
            for phase in runs[0].get(f"{step}_phases") or {}:
                values = [r[f"{step}_phases"].get(phase) for r in runs]
                seconds = statistics.median(v for v in values if v is not None)
                # the copy's rate against the yardstick; the other steps' time only
                row(f"    {phase}", moved if phase == "copy" else None, seconds,
                    base if phase == "copy" else None)
            rest = med_rest(runs, step)
            row(f"  the rest: round trip{' and ' + what if what else ''}", None, rest)
    return rows


def memory_lines(fig: dict) -> list[str]:
    lines = []
    for key in ("plain", "attached"):
        runs = fig.get(key)
        if not runs:
            continue
        # The first sleep makes and pins its host memory; later ones reuse what the wake
        # before them let go of (daemon/backends/tier.py, Spares).
        lines.append(f"{key}, each run: sleep " + ", ".join(
            f"{r['sleep_wall_s']:.3f} s (host memory "
            f"{r['sleep_phases'].get('host_memory', 0):.3f}, pin "
            f"{r['sleep_phases'].get('pin', 0):.3f})" for r in runs) + "; wake " + ", ".join(
            f"{r['wake_wall_s']:.3f} s" for r in runs))
        r = runs[0]
        for src, label in (("driver_free", "the driver's free memory (cuMemGetInfo)"),
                           ("daemon_free", "the daemon's free bytes"), ("ours", "ours")):
            vals = [r[s].get(src) for s in ("awake", "asleep", "woken")]
            if None in vals:
                continue
            awake, asleep, woken = vals
            lines.append(f"{key}, run 1, {label}: awake {format_size(awake)}, asleep "
                         f"{format_size(asleep)} ({(asleep - awake) / GiB:+.2f} GiB), woken "
                         f"{format_size(woken)}")
    return lines


def print_table(fig: dict, rows: list[dict]) -> None:
    m, cfg = fig["machine"], fig["config"]
    gpu = f"{m['gpu']} (1 of {m['gpu_count']})" if m["gpu"] else "no GPU (nvidia-smi)"
    print(f"gpumemctl sleep/wake benchmark - {gpu}; {m['cpu_model']}, {m['nproc']} cores, "
          f"{m['mem_gib']} GiB RAM, Linux {m['kernel']}, load average at start "
          f"{m['loadavg_at_start'][0]}")
    print(f"gpumemd --backend {cfg['backend']}"
          + (f" (device {cfg['device']})" if cfg["backend"] == "cuda" else "")
          + f"; one {'durable' if cfg['durable'] else 'transient'} allocation of "
          f"{format_size(cfg['size'])}, ecc {cfg['ecc']}; ratio = GB/s / the yardstick's "
          f"(sleep: device->host, wake: host->device); GB/s = 10^9 bytes/s; total run "
          f"{fig['wall_s']:.1f} s")
    for line in core.markdown_table(rows, ["step", "bytes", "seconds", "GB/s", "ratio"]):
        print(line)
    for line in memory_lines(fig):
        print(line)
    verify = [r["verify"] for k in ("plain", "attached") for r in fig.get(k) or []]
    blocks = sorted({v.get("blocks") for v in verify if v})
    fixed = sum(v.get("corrected") or 0 for v in verify)
    print(f"each wake checked the bytes against their parity: {blocks or '?'} blocks, "
          f"{fixed} corrected, none uncorrectable; {len(samples(cfg['size']))} samples of "
          f"the bytes compared after each wake"
          + ("; the attachment's address unchanged after each" if fig.get("attached") else ""))


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("host", "cuda"), default=None,
                   help="gpumemd backend (default: cuda if a GPU is usable, else host)")
    p.add_argument("--size", default=None,
                   help="bytes of the allocation (default 16G on cuda, 1G on host)")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--runs", type=int, default=3,
                   help="sleep/wake cycles of each kind (default 3; the median)")
    p.add_argument("--no-attach", dest="attach", action="store_false",
                   help="leave out the cycles with the allocation attached here")
    p.add_argument("--transient", action="store_true",
                   help="a transient allocation (default durable)")
    p.add_argument("--ecc", choices=("rs", "none"), default=None,
                   help="the allocation's ECC (default: the daemon's, rs)")
    p.add_argument("--host-capacity", default=None, help="gpumemd --host-capacity (host)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--keep", action="store_true",
                   help="keep the daemon's temp dir (log, registry)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.backend = args.backend or ("cuda" if harness.usable_gpus() > 0 else "host")
    try:
        args.size = parse_size(args.size or ("16G" if args.backend == "cuda" else "1G"))
        if args.host_capacity:
            parse_size(args.host_capacity)
    except UsageError as exc:
        p.error(str(exc))
    if args.size <= 0:
        p.error("--size must be more than 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-sleepbench-", dir="/tmp")
    extra = ["--host-capacity", args.host_capacity] if args.host_capacity else []
    d = core.Daemon(base, backend=args.backend, extra_args=extra)
    fig: dict = {"machine": fs.machine(args.backend), "base_dir": base,
                 "config": {"backend": args.backend, "size": args.size, "device": args.device,
                            "runs": args.runs, "attach": args.attach,
                            "durable": not args.transient, "ecc": args.ecc}}
    if args.backend == "cuda":      # the GPU used, where there are several
        name = fs.nvidia_smi("-i", str(args.device), "--query-gpu=name",
                             "--format=csv,noheader")
        fig["machine"]["gpu"] = name or fig["machine"]["gpu"]
    started = time.perf_counter()
    try:
        run_all(d, fig)
        fig["wall_s"] = time.perf_counter() - started
    except KeyboardInterrupt:
        say("interrupted; stopping gpumemd and removing what the benchmark made")
        return 130
    except Failed as exc:
        core.show_log_tail(d)
        say(f"error: {exc}")
        return 1
    except Exception:
        core.show_log_tail(d)
        raise
    finally:
        d.cleanup()
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
