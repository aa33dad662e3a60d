#!/usr/bin/env python3
"""Snapshot benchmark: `gpumemctl snapshot create/restore` against the disk's and memory's rates.

    python3 bench/snapshot.py                                  # table
    python3 bench/snapshot.py --backend host --size 256M --runs 1
    python3 bench/snapshot.py --json           # the same figures as JSON

It starts its own gpumemd (the console script next to this interpreter, through bench/core.py's
harness) in a fresh /tmp/gpumemctl-snapbench-* directory, writes its snapshots and dd files in
a fresh directory under --disk-dir (default /var/tmp: the real disk, not tmpfs) and under
--shm-dir (default /dev/shm), and removes all of it at the end, also on an error, Ctrl-C or
SIGTERM: the daemon, its keepers, the snapshot stores, the dd files, the source file.
Progress goes to stderr; only the table (or the JSON) goes to stdout. Every rate is
GB/s = 10^9 bytes/s and the best of --runs runs (highest rate, shortest time). Exit status
0 when every target is met, 1 when one is missed, 130 on Ctrl-C. What each row means:
bench/README.md.

  1. Baselines, in the same run: `dd bs=16M oflag=direct` from /dev/zero to the disk dir and
     `dd bs=16M iflag=direct` back (dd's own report); on cuda the pinned device->host and
     host->device copy rates (bench/gpu.py's phase_pinned), on host a tmpfs copy of the same
     size into /dev/shm with dd bs=16M.
  2. One durable allocation of --size, filled with random data (`gpumemctl write`).
     `snapshot create DISK NAME` (full), then 1% of its 1 MiB blocks changed through one rw
     handle and `snapshot create --incremental`, then another 1% through one handle per
     block and another incremental; then the memory is lost (gpumemd stopped, its keeper
     killed, gpumemd started: the allocation is `lost`), the page cache dropped (root), and
     `snapshot restore DISK/snap-<full> NAME` refills it. The same full create and restore
     with a store in the shm dir. The first run reads the allocation back after each restore
     and compares its sha256 with the data written (not timed).
  3. restore_on_start: gpumemd configured with `snapshot_dir = SHM store` and
     `restore_on_start = true` (a TOML file, --config), the memory lost, gpumemd started:
     from the spawn until it answers, and until `info` (every 10 ms) says `ready`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
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
import fs  # noqa: E402  bench/fs.py: dd's report, drop_caches, the machine with its GPU

from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402
from tests import harness  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
DD_BS = 16 * MiB
BLOCK = MiB                      # the snapshot's checksummed block (gpumemctl/snapshots)
NAME = "snapbench/data"
IO_ENV = "GPUMEMCTL_SNAPSHOT_IO"
HASH_ENV = "GPUMEMCTL_SNAPSHOT_HASH"   # where the block checksums are computed (gpuhash.py)
say, gbps = core.say, core.gbps
# Targets: ratios to the row's baseline, measured in the same run.
TARGET_DISK = 0.9                # create / restore vs dd direct write / read
TARGET_SHM_CUDA = 0.5            # create / restore to/from /dev/shm vs the pinned copy rate
TARGET_INCREMENTAL = 20.0        # full snapshot time / incremental snapshot time
AUTORESTORE_LOG = re.compile(r"restore_on_start: (\d+) of (\d+) allocation\(s\) restored "
                             r"from .* in ([0-9.]+) s")


class Failed(RuntimeError):
    """The benchmark itself failed (not a missed target)."""


# ---- the machine --------------------------------------------------------------------------------
def pick_backend(choice: str | None) -> str:
    """cuda when gpumemd's cuda backend could use a device (tests/harness.usable_gpus)."""
    if choice:
        return choice
    return "cuda" if harness.usable_gpus() > 0 else "host"


def mount_of(path: str) -> dict:
    """The mount holding `path`: its device, mount point and filesystem type."""
    best = {"device": "?", "mountpoint": "", "fstype": "?"}
    path = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, kind = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best["mountpoint"]):
                    best = {"device": dev, "mountpoint": mnt, "fstype": kind}
    except OSError:
        pass
    return best


# ---- dd baselines -------------------------------------------------------------------------------
def dd(*operands: str) -> dict:
    """One dd; bytes and seconds from its own report (LC_ALL=C)."""
    argv = ["dd", *operands]
    proc = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "LC_ALL": "C"})
    found = fs.DD_SUMMARY.search(proc.stderr)
    if proc.returncode != 0 or not found:
        raise Failed(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-1000:]}")
    nbytes, secs = int(found.group(1)), float(found.group(2))
    return {"bytes": nbytes, "seconds": secs, "gbps": gbps(nbytes, secs)}


def phase_disk_baseline(disk: str, size: int, runs: int) -> dict:
    """dd direct write from /dev/zero and direct read back, bs=16M, `size` rounded up to
    16 MiB. Where the filesystem refuses O_DIRECT: conv=fsync, and the read after
    drop_caches (root), else from the page cache (said in the figures)."""
    count = -(-size // DD_BS)
    path = os.path.join(disk, "ddfile")
    out: dict = {"bytes": count * DD_BS, "mode": "direct", "write": [], "read": []}
    for n in range(runs):
        say(f"baseline: dd bs=16M oflag=direct -> {path}, run {n + 1}/{runs}")
        try:
            if out["mode"] != "direct":
                raise Failed("O_DIRECT refused before")
            w = dd("if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "oflag=direct")
        except Failed as exc:
            if out["mode"] == "direct":
                say(f"dd oflag=direct failed ({str(exc).splitlines()[-1][:120]}); "
                    "using conv=fsync")
            out["mode"] = "fsync"
            w = dd("if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync")
        if out["mode"] == "direct":
            r = dd(f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct")
        else:
            out["read_after_drop_caches"] = fs.drop_caches()
            r = dd(f"if={path}", "of=/dev/null", "bs=16M")
        os.unlink(path)
        out["write"].append(w)
        out["read"].append(r)
    out["write_gbps"] = max(x["gbps"] for x in out["write"])
    out["read_gbps"] = max(x["gbps"] for x in out["read"])
    return out


def phase_tmpfs_baseline(src: str, shm: str, runs: int) -> dict:
    """The host backend's yardstick: dd bs=16M of the source file into a new /dev/shm file
    (memcpy-bound: tmpfs page cache to a user buffer to tmpfs)."""
    dst = os.path.join(shm, "ddcopy")
    results = []
    for n in range(runs):
        say(f"baseline: dd bs=16M {src} -> {dst}, run {n + 1}/{runs}")
        results.append(dd(f"if={src}", f"of={dst}", "bs=16M"))
        os.unlink(dst)
    return {"runs": results, "gbps": max(r["gbps"] for r in results)}


def phase_tmpfs_ceiling(shm: str, size: int) -> dict:
    """What tmpfs itself takes and gives at best, for context on the shm rows: `size`
    bytes from one 256 MiB buffer, written by 16 threads as 8 MiB pwrites into 16 files
    (as a snapshot stripes them), then read back the same way. No page cache is dropped:
    tmpfs is the page cache."""
    from concurrent.futures import ThreadPoolExecutor
    piece, files = 8 << 20, 16
    buf = memoryview(bytearray(os.urandom(1 << 20)) * 256)
    paths = [os.path.join(shm, f"ceiling-{k}") for k in range(files)]
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600) for p in paths]
    jobs = [(fds[(i // piece) % files], (i // piece // files) * piece,
             buf[i % len(buf):i % len(buf) + piece]) for i in range(0, size, piece)]
    try:
        with ThreadPoolExecutor(16) as pool:
            t = time.perf_counter()
            list(pool.map(lambda j: os.pwrite(j[0], j[2], j[1]), jobs))
            write_s = time.perf_counter() - t
            out = bytearray(piece * 16)
            views = [memoryview(out)[k * piece:(k + 1) * piece] for k in range(16)]
            t = time.perf_counter()
            list(pool.map(lambda kj: os.preadv(kj[1][0], [views[kj[0] % 16]], kj[1][1]),
                          enumerate(jobs)))
            read_s = time.perf_counter() - t
    finally:
        for fd, p in zip(fds, paths, strict=True):
            os.close(fd)
            os.unlink(p)
    return {"write_gbps": size / write_s / 1e9, "read_gbps": size / read_s / 1e9}


def phase_pinned(runs: int) -> dict:
    """The cuda backend's yardstick: bench/gpu.py's pinned cuMemcpyHtoD/DtoH of 256 MiB."""
    import gpu  # bench/gpu.py (imports the CUDA driver bindings: cuda only)
    results = [gpu.phase_pinned(0) for _ in range(runs)]
    return {"runs": results, "h2d_gbps": max(r["h2d_gbps"] for r in results),
            "d2h_gbps": max(r["d2h_gbps"] for r in results)}


# ---- the data -----------------------------------------------------------------------------------
def make_source(path: str, size: int) -> str:
    """`size` bytes: a 64 MiB random pattern repeated, each 1 MiB block stamped with its
    index (no two blocks alike). Returns the sha256."""
    say(f"writing {format_size(size)} of random data to {path}")
    pattern = bytearray(os.urandom(64 * MiB))
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for at in range(0, size, len(pattern)):
            for b in range(0, len(pattern), BLOCK):
                pattern[b:b + 8] = ((at + b) // BLOCK).to_bytes(8, "little")
            part = memoryview(pattern)[:min(len(pattern), size - at)]
            f.write(part)
            digest.update(part)
    return digest.hexdigest()


class _Sha256Sink:
    """A file-like sink for Client.read_to that only hashes."""

    def __init__(self):
        self.digest, self.n = hashlib.sha256(), 0

    def write(self, data) -> int:
        self.digest.update(data)
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def allocation_sha256(d: core.Daemon) -> str:
    sink = _Sha256Sink()
    with d.client() as c:
        c.read_to(NAME, sink)
    return sink.digest.hexdigest()


def verify(d: core.Daemon, want: str, what: str) -> None:
    say(f"checking the sha256 of {NAME} after {what}")
    got = allocation_sha256(d)
    if got != want:
        raise Failed(f"after {what}, {NAME} has sha256 {got}; the data written has {want}")


def change_blocks(d: core.Daemon, size: int, shift: int, per_block: bool) -> dict:
    """Overwrite 1% of the allocation's 1 MiB blocks (at least one), spread evenly, with
    new random data: through one rw handle, or one handle per block."""
    nblocks = -(-size // BLOCK)
    k = max(1, round(nblocks / 100))
    blocks = sorted({((2 * i + 1) * nblocks // (2 * k) + shift) % nblocks for i in range(k)})
    with d.client() as c:
        if per_block:
            for b in blocks:
                with c.open(NAME, "rw") as h:
                    h.write(os.urandom(min(BLOCK, size - b * BLOCK)), b * BLOCK)
        else:
            with c.open(NAME, "rw") as h:
                for b in blocks:
                    h.write(os.urandom(min(BLOCK, size - b * BLOCK)), b * BLOCK)
    return {"blocks": len(blocks), "of": nblocks,
            "bytes": sum(min(BLOCK, size - b * BLOCK) for b in blocks)}


# ---- the daemon ---------------------------------------------------------------------------------
def gpumemctl_json(d: core.Daemon, env: dict, *args: str) -> tuple[dict, float]:
    """`gpumemctl --socket S ARGS --json` as installed; its JSON and the process's wall time."""
    argv = core.console_script("gpumemctl") + ["--socket", d.socket, *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env={**core.clean_env(), **env},
                          stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise Failed(f"gpumemctl {' '.join(args)} exited {proc.returncode}: "
                     f"{proc.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(proc.stdout), wall


def wait_gone(pid: int | None, state_dir: str, timeout: float = 30.0) -> None:
    if pid:
        harness.wait_for(lambda: not harness.is_keeper(pid, state_dir), timeout, 0.01,
                         what=f"keeper {pid} to exit")


def lose_memory(d: core.Daemon) -> None:
    """Stop gpumemd (SIGTERM) and kill its keeper: the allocation's memory is gone."""
    code = d.stop()
    if code != 0:
        raise Failed(f"gpumemd exited {code} after SIGTERM:\n{d.log_tail()}")
    pid = d.keeper_pid()
    d.note_keeper()
    d.kill_keeper()
    wait_gone(pid, d.state_dir)


def lose_and_restart(d: core.Daemon) -> None:
    say("losing the memory: stopping gpumemd, killing its keeper, starting gpumemd")
    lose_memory(d)
    d.start(timeout=120)
    with d.client() as c:
        state = c.info(NAME)["state"]
    if state != "lost":
        raise Failed(f"{NAME} is '{state}' after the keeper was killed, expected 'lost'")


# ---- the snapshot runs --------------------------------------------------------------------------
def snapshot_create(d, env, store: str, incremental: bool = False) -> dict:
    args = ["snapshot", "create", store, NAME, *(["--incremental"] if incremental else [])]
    result, wall = gpumemctl_json(d, env, *args)
    if result.get("skipped") or len(result.get("allocations", [])) != 1:
        raise Failed(f"snapshot create {store}: {result}")
    if result.get("incremental") != incremental:
        raise Failed(f"snapshot create {store}: incremental={result.get('incremental')}, "
                     f"expected {incremental}")
    result["wall_s"] = wall
    return result


def snapshot_restore(d, env, src: str) -> dict:
    result, wall = gpumemctl_json(d, env, "snapshot", "restore", src, NAME)
    outcome = [a.get("result") for a in result.get("allocations", [])]
    if outcome != ["ok"] or result.get("damaged") or result.get("failed"):
        raise Failed(f"snapshot restore {src}: {result}")
    with d.client() as c:
        state = c.info(NAME)["state"]
    if state != "ready":
        raise Failed(f"{NAME} is '{state}' after the restore from {src}")
    result["wall_s"] = wall
    return result


def one_run(d, env, n: int, runs: int, size: int, disk: str, shm: str, want: str,
            fig: dict) -> str:
    """One run of every timed snapshot operation; returns the shm store it leaves."""
    tag = f"run {n + 1}/{runs}"
    r: dict = {}
    store = os.path.join(disk, f"store-{n + 1}")
    say(f"{tag}: snapshot create (full) -> {store}")
    r["create_disk"] = snapshot_create(d, env, store)
    say(f"{tag}: 1% of the blocks changed through one rw handle; snapshot create "
        "--incremental")
    r["change_one_handle"] = change_blocks(d, size, 0, per_block=False)
    r["incremental_one_handle"] = snapshot_create(d, env, store, incremental=True)
    say(f"{tag}: another 1% through one handle per block; snapshot create --incremental")
    nblocks = -(-size // BLOCK)
    r["change_per_block"] = change_blocks(d, size, max(1, nblocks // 200), per_block=True)
    r["incremental_per_block"] = snapshot_create(d, env, store, incremental=True)
    lose_and_restart(d)
    r["dropped_caches"] = fs.drop_caches()
    full = r["create_disk"]["location"]
    say(f"{tag}: snapshot restore {full} (the full snapshot) into the lost allocation"
        + ("" if r["dropped_caches"] else " (not root: page cache not dropped)"))
    r["restore_disk"] = snapshot_restore(d, env, full)
    if n == 0:
        verify(d, want, "the restore from the disk dir")
        fig["verified"].append("disk restore")
    shutil.rmtree(store, ignore_errors=True)

    shm_store = os.path.join(shm, f"store-{n + 1}")
    say(f"{tag}: snapshot create (full) -> {shm_store}")
    r["create_shm"] = snapshot_create(d, env, shm_store)
    lose_and_restart(d)
    say(f"{tag}: snapshot restore {shm_store} into the lost allocation")
    r["restore_shm"] = snapshot_restore(d, env, shm_store)
    if n == 0:
        verify(d, want, "the restore from the shm dir")
        fig["verified"].append("shm restore")
    fig["runs"].append(r)
    return shm_store


def phase_autorestore(d: core.Daemon, store: str, base: str, want: str) -> dict:
    """restore_on_start from `store` (its newest snapshot holds the data `want`)."""
    config = os.path.join(base, "gpumemd.toml")
    with open(config, "w") as f:     # JSON's string escapes are TOML's basic string's
        f.write(f"snapshot_dir = {json.dumps(store)}\nrestore_on_start = true\n")
    say("restore_on_start: losing the memory, starting gpumemd with snapshot_dir = "
        f"{store}, restore_on_start = true")
    lose_memory(d)
    d.extra_args = [*d.extra_args, "--config", config]
    t_spawn = d.spawn()
    c = d.connect(timeout=120)
    answered = time.perf_counter() - t_spawn
    d.note_keeper()
    states: list[str] = []
    deadline = time.monotonic() + 600
    try:
        while True:
            state = c.info(NAME)["state"]
            if not states or states[-1] != state:
                states.append(state)
            if state == "ready":
                break
            if time.monotonic() > deadline:
                raise Failed(f"{NAME} not ready 600 s after the start (states {states})")
            time.sleep(0.01)
        ready = time.perf_counter() - t_spawn
    finally:
        c.close()
    out = {"answer_s": answered, "ready_s": ready, "states": states}
    # The restoring child's own account (daemon/services/autosnap.py logs it once it has ended).
    found = None
    for _ in range(100):
        found = AUTORESTORE_LOG.search(d.log_tail(1 << 20))
        if found:
            break
        time.sleep(0.01)
    if found:
        out.update(restored=int(found.group(1)), queued=int(found.group(2)),
                   child_restore_s=float(found.group(3)))
    verify(d, want, "restore_on_start")
    return out


def kvikio_probe(env: dict) -> dict:
    """Whether KvikIO imports here and whether it prefers its compatibility mode (no GDS),
    asked in a child so that this process loads nothing of it."""
    code = ("import json, kvikio, kvikio.defaults; print(json.dumps({'version': "
            "getattr(kvikio, '__version__', '?'), 'compat_mode_preferred': "
            "bool(kvikio.defaults.is_compat_mode_preferred())}))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**core.clean_env(), **env}, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"importable": False, "error": str(exc)}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"importable": False, "error": last[:200]}
    return {"importable": True, **json.loads(proc.stdout.strip().splitlines()[-1])}


# ---- report -------------------------------------------------------------------------------------
def best(fig: dict, key: str, field: str = "rate", low: bool = False) -> dict:
    """The run whose `key` result is best: highest `field`, or lowest with low=True."""
    results = [r[key] for r in fig["runs"]]
    return (min if low else max)(results, key=lambda x: x[field] or 0)


def rows_from(fig: dict) -> list[dict]:
    rows: list[dict] = []
    cuda = fig["config"]["backend"] == "cuda"
    size = format_size(fig["config"]["size"])

    def row(what, measured, baseline="", ratio="", target="", met=""):
        rows.append({"what": what, "measured": measured, "baseline": baseline,
                     "ratio": ratio, "target": target, "met": met})

    def gb(v: float) -> str:
        return f"{v:.2f} GB/s"

    def judged(what, value, base, threshold, base_what):
        ratio = value / base if base else float("nan")
        row(what, gb(value), f"{gb(base)} {base_what}", f"{ratio:.2f}x",
            f">= {threshold:g}x" if threshold else "",
            ("met" if ratio >= threshold else "missed") if threshold else "")

    disk = fig["disk_baseline"]
    direct = disk["mode"] == "direct"
    wflag = "oflag=direct" if direct else "conv=fsync (O_DIRECT refused)"
    rflag = "iflag=direct" if direct else "after drop_caches" if \
        disk.get("read_after_drop_caches") else "from the page cache"
    dd_size = format_size(disk["bytes"])
    row(f"baseline: dd write {dd_size} bs=16M {wflag} -> disk dir", gb(disk["write_gbps"]))
    row(f"baseline: dd read {dd_size} bs=16M {rflag} <- disk dir", gb(disk["read_gbps"]))
    if cuda:
        pin = fig["pinned"]
        row("baseline: pinned copy device->host (cuMemcpyDtoH, 256 MiB)",
            gb(pin["d2h_gbps"]))
        row("baseline: pinned copy host->device (cuMemcpyHtoD, 256 MiB)",
            gb(pin["h2d_gbps"]))
        shm_w, shm_r = pin["d2h_gbps"], pin["h2d_gbps"]
        shm_w_what, shm_r_what = "pinned D->H", "pinned H->D"
        shm_target = TARGET_SHM_CUDA
    else:
        shm_w = shm_r = fig["tmpfs_baseline"]["gbps"]
        row(f"baseline: dd copy {size} bs=16M /dev/shm -> /dev/shm (memcpy-bound)",
            gb(shm_w))
        shm_w_what = shm_r_what = "tmpfs dd"
        shm_target = None

    ceiling = fig.get("tmpfs_ceiling")
    if ceiling:
        row(f"context: tmpfs takes {size} from 16 threads, 8 MiB pwrites to 16 files",
            gb(ceiling["write_gbps"]))
        row(f"context: tmpfs gives {size} to 16 threads, 8 MiB preads from 16 files",
            gb(ceiling["read_gbps"]))
    cd = best(fig, "create_disk")
    judged(f"snapshot create {size} full -> disk dir (fsynced)", cd["rate"] / 1e9,
           disk["write_gbps"], TARGET_DISK, "dd write")
    rd = best(fig, "restore_disk")
    cold = all(r["dropped_caches"] for r in fig["runs"])
    judged(f"snapshot restore {size} <- disk dir into the lost allocation"
           + (", after drop_caches" if cold else ", PAGE CACHE NOT DROPPED (not root)"),
           rd["rate"] / 1e9, disk["read_gbps"], TARGET_DISK, "dd read")
    cs = best(fig, "create_shm")
    judged(f"snapshot create {size} full -> shm dir", cs["rate"] / 1e9, shm_w, shm_target,
           shm_w_what)
    rs = best(fig, "restore_shm")
    judged(f"snapshot restore {size} <- shm dir into the lost allocation", rs["rate"] / 1e9,
           shm_r, shm_target, shm_r_what)

    full_s = best(fig, "create_disk", "seconds", low=True)["seconds"]
    full_wall = best(fig, "create_disk", "wall_s", low=True)["wall_s"]
    for key, how in (("one_handle", "one rw handle"), ("per_block", "one handle per block")):
        inc = best(fig, f"incremental_{key}", "seconds", low=True)
        ch = fig["runs"][0][f"change_{key}"]
        speed = full_s / inc["seconds"] if inc["seconds"] else float("inf")
        target = key == "one_handle"
        row(f"snapshot create --incremental -> disk dir, {ch['blocks']} of {ch['of']} "
            f"1 MiB blocks changed ({how})", f"{inc['seconds']:.3f} s",
            f"{full_s:.3f} s full", f"{speed:.1f}x faster",
            f">= {TARGET_INCREMENTAL:g}x" if target else "",
            ("met" if speed >= TARGET_INCREMENTAL else "missed") if target else "")
        row("  bytes written / bytes read by it",
            f"{format_size(inc['bytes_written'])} / {format_size(inc['bytes_read'])}")
        wall = best(fig, f"incremental_{key}", "wall_s", low=True)["wall_s"]
        row("  whole command, CLI start-up included", f"{wall:.3f} s",
            f"{full_wall:.3f} s full", f"{full_wall / wall:.1f}x faster")

    ar = fig["autorestore"]
    row(f"restore_on_start {size} from the shm dir: spawn -> '{NAME}' ready",
        f"{ar['ready_s']:.3f} s")
    row("  spawn -> gpumemd answers a Client", f"{ar['answer_s']:.3f} s")
    if "child_restore_s" in ar:
        row("  the restore child's own time (daemon log)", f"{ar['child_restore_s']:.3f} s")
    return rows


def io_line(fig: dict) -> str:
    cd = fig["runs"][0]["create_disk"]
    rd = fig["runs"][0]["restore_disk"]
    cs, rs = fig["runs"][0]["create_shm"], fig["runs"][0]["restore_shm"]
    parts = [f"I/O path: snapshot create reported io={cd.get('io')}, restore "
             f"io={rd.get('io')}",
             f"block checksums computed on: create {cs.get('checksums')}, restore "
             f"{rs.get('checksums')}"]
    if fig["config"]["io"]:
        parts.append(f"{IO_ENV}={fig['config']['io']} was set for them")
    if fig["config"].get("hash"):
        parts.append(f"{HASH_ENV}={fig['config']['hash']} was set for them")
    kv = fig.get("kvikio")
    if kv is not None:
        if kv["importable"]:
            mode = "preferred (no GDS)" if kv["compat_mode_preferred"] else \
                "not preferred (GDS possible)"
            parts.append(f"KvikIO {kv.get('version')} importable, compatibility mode {mode}")
        else:
            parts.append(f"KvikIO not importable ({kv.get('error')})")
    return "; ".join(parts)


def print_table(fig: dict, rows: list[dict]) -> None:
    m, c = fig["machine"], fig["config"]
    dm = fig["disk_mount"]
    gpu = f"{m['gpu']} (x{m['gpu_count']})" if m["gpu"] else "no GPU (nvidia-smi)"
    print(f"gpumemctl snapshot benchmark - {m['cpu_model']}, {m['nproc']} cores, "
          f"{m['mem_gib']} GiB RAM, {gpu}, Linux {m['kernel']}, load average at start "
          f"{m['loadavg_at_start'][0]}")
    print(f"gpumemd --backend {c['backend']}; one durable allocation of "
          f"{format_size(c['size'])} (ecc {c.get('ecc')}); disk dir {c['disk_dir']} "
          f"({dm['fstype']} on {dm['device']}); shm dir {c['shm_dir']}")
    print(f"best of {c['runs']} run(s) (highest rate, shortest time); GB/s = 10^9 bytes/s; "
          f"total run {fig['wall_s']:.1f} s")
    for line in core.markdown_table(rows, ["what", "measured", "baseline", "ratio", "target",
                                           "met"]):
        print(line)
    print(io_line(fig))
    judged = [r for r in rows if r["target"]]
    missed = [r["what"] for r in judged if r["met"] == "missed"]
    print(f"targets: {len(judged) - len(missed)} of {len(judged)} met"
          + (f"; missed: {'; '.join(missed)}" if missed else ""))
    ar = fig["autorestore"]
    print(f"sha256 of the allocation read back and equal to the data written after: "
          f"{', '.join(fig['verified'])}; restore_on_start states seen: "
          f"{' -> '.join(ar['states'])}")


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("host", "cuda"), default=None,
                   help="gpumemd backend (default: cuda if a GPU is usable, else host)")
    p.add_argument("--size", default=None,
                   help="bytes of the one allocation (default 4G on cuda, 1G on host)")
    p.add_argument("--disk-dir", default="/var/tmp",
                   help="where the disk snapshots and dd file go (a fresh directory in it)")
    p.add_argument("--shm-dir", default="/dev/shm",
                   help="where the shm snapshots and the source go (a fresh directory in it)")
    p.add_argument("--runs", type=int, default=2, help="runs of each measurement (best)")
    p.add_argument("--io", choices=("staged", "kvikio"), default=None,
                   help=f"set {IO_ENV} for the snapshot commands (and gpumemd)")
    p.add_argument("--hash", choices=("cpu", "gpu"), default=None,
                   help=f"set {HASH_ENV} for the snapshot commands: where the block checksums "
                        "are computed (default: the GPU's where it can)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--keep", action="store_true",
                   help="keep the daemon's temp dir (log, registry); the data dirs go")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    return args


def check_space(disk: str, shm: str, size: int) -> None:
    need = {disk: size + size // 8 + 64 * MiB, shm: 2 * size + 64 * MiB}
    if os.stat(disk).st_dev == os.stat(shm).st_dev:
        need = {disk: need[disk] + need[shm]}
    for where, n in need.items():
        free = shutil.disk_usage(where).free
        if free < n:
            raise SystemExit(f"bench/snapshot.py: {where} has {format_size(free)} free, "
                             f"{format_size(n)} needed (use --size)")


def run_all(d: core.Daemon, args, fig: dict, base: str, disk: str, shm: str) -> None:
    c = fig["config"]
    size, runs, env = c["size"], c["runs"], fig["env"]
    fig["disk_baseline"] = phase_disk_baseline(disk, size, runs)
    if c["backend"] == "cuda":
        say("baseline: pinned copy rates (bench/gpu.py)")
        fig["pinned"] = phase_pinned(runs)
        fig["kvikio"] = kvikio_probe(env)
    src = os.path.join(shm, "source")
    want = make_source(src, size)
    fig["sha256"] = want
    if c["backend"] == "host":
        fig["tmpfs_baseline"] = phase_tmpfs_baseline(src, shm, runs)
    say("baseline: what tmpfs takes and gives with 16 writers/readers")
    fig["tmpfs_ceiling"] = phase_tmpfs_ceiling(shm, size)
    say(f"starting gpumemd --backend {c['backend']} in {base}")
    d.start(timeout=120)
    with d.client() as cl:
        cl.create(NAME, size, durable=True, device="0" if c["backend"] == "cuda" else None)
        c["ecc"] = cl.info(NAME).get("ecc")
    say(f"filling {NAME} with gpumemctl write")
    d.cli("write", NAME, src, check=True, timeout=3600)
    os.unlink(src)
    store = None
    for n in range(runs):
        if store:
            shutil.rmtree(store, ignore_errors=True)
        store = one_run(d, env, n, runs, size, disk, shm, want, fig)
    fig["autorestore"] = phase_autorestore(d, store, base, want)


def main(argv=None) -> int:
    args = parse_args(argv)
    backend = pick_backend(args.backend)
    size = parse_size(args.size or ("4G" if backend == "cuda" else "1G"))
    for where in (args.disk_dir, args.shm_dir):
        if not os.path.isdir(where):
            raise SystemExit(f"bench/snapshot.py: {where}: no such directory")
    check_space(args.disk_dir, args.shm_dir, size)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    made: list[str] = []
    base = tempfile.mkdtemp(prefix="gpumemctl-snapbench-", dir="/tmp")
    made.append(base)
    env = {IO_ENV: args.io} if args.io else {}
    if args.hash:
        env[HASH_ENV] = args.hash
    d = core.Daemon(base, backend=backend)
    d.extra_env = dict(env)          # restore_on_start's child inherits gpumemd's environment
    fig: dict = {"machine": fs.machine(backend), "env": env, "runs": [], "verified": [],
                 "base_dir": base,
                 "config": {"backend": backend, "size": size, "runs": args.runs,
                            "io": args.io, "hash": args.hash}}
    started = time.perf_counter()
    try:
        disk = tempfile.mkdtemp(prefix="gpumemctl-snapbench-", dir=args.disk_dir)
        made.append(disk)
        shm = tempfile.mkdtemp(prefix="gpumemctl-snapbench-", dir=args.shm_dir)
        made.append(shm)
        fig["config"].update(disk_dir=disk, shm_dir=shm)
        fig["disk_mount"] = mount_of(disk)
        if fig["disk_mount"]["fstype"] in ("tmpfs", "ramfs"):
            say(f"warning: {disk} is on {fig['disk_mount']['fstype']}, not a disk")
        run_all(d, args, fig, base, disk, shm)
        fig["wall_s"] = time.perf_counter() - started
    except KeyboardInterrupt:
        say("interrupted; stopping gpumemd and removing what the benchmark made")
        return 130
    except Exception:
        core.show_log_tail(d)
        raise
    finally:
        d.cleanup()
        for path in made[1:]:
            shutil.rmtree(path, ignore_errors=True)
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    rows = rows_from(fig)
    core.emit(fig, rows, args.json, print_table)
    return 1 if any(r["met"] == "missed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
