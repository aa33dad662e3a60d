#!/usr/bin/env python3
"""Model weights benchmark (issue 17): `gpumemctl load` and `gpumemctl.tensors.load` of a
safetensors file, against the pinned copy rate and `safetensors.torch.load_file`.

    source .gpu/env.sh; python3 bench/tensors.py                       # GPU machine, 16 GiB
    python3 bench/tensors.py --backend host --size 512M   # any machine
    python3 bench/tensors.py --json                     # the same figures as one JSON document

It starts its own gpumemd (the console script next to this interpreter, through bench/core.py's
harness) in a fresh /tmp/gpumemctl-tensorbench-* directory, writes the model file into a fresh
/dev/shm/gpumemctl-tensorbench-* directory, and removes both at the end, also on an error,
Ctrl-C or SIGTERM (gpumemd and its keeper killed; --keep keeps the daemon's directory with its
log). Progress goes to stderr; only the table (or the JSON) goes to stdout. Exit status 0 when
the run completed (the table marks each target met or missed; --strict makes a missed target
exit 1), 1 when a loaded tensor differs from the file's or the run failed (the error and the
end of gpumemd's log on stderr), 130 on Ctrl-C. What each row means: bench/README.md.

  1. The file: --size of --dtype tensors (bf16 on cuda; f16 on host, which numpy and so
     safetensors.numpy can hold) shaped as a Llama-style model (embedding, per-layer
     attention, MLP and norm weights, head), random bytes, written by the safetensors library
     itself (safetensors.numpy.save_file of views of one random buffer: memory stays bounded
     by the largest tensor where the library takes pointers, safetensors >= 0.6).
  2. The yardstick, in this process: on cuda bench/gpu.py's pinned cuMemcpyHtoD of 256 MiB
     (phase_pinned, best of 2); on host bench/snapshot.py's dd copy of the file into /dev/shm.
  3. `gpumemctl load FILE NAME --durable --ecc none` and `--ecc rs` (the installed CLI, --json):
     GB/s from the command's own `seconds` and from the process's wall time, best of
     --load-runs, and where the command's seconds went (create, copy, finish). Target: >=
     0.8x the yardstick. Before them one load into the fresh daemon, on a row of its own: a
     GPU's first use of memory is slower (26 against 40 GB/s on an H200), which would
     otherwise fall on whichever row came first.
  4. A fresh process (`python -c`) per run, --runs times (after one warm-up), alternating:
     `import gpumemctl.tensors` + `gpumemctl.tensors.load(NAME, framework)` + reading one
     element of the last tensor, against `import safetensors.torch` +
     `safetensors.torch.load_file(FILE, device="cuda")` + the same read (numpy and
     safetensors.numpy.load_file on host). Each child first imports its framework and, on
     cuda, creates the CUDA context (`torch.zeros(1, device="cuda")`), timed and reported on
     their own, not in the figure. Target: p50 <= 50 ms.
  5. Checks, not timed: a child of each kind (both allocations, and safetensors') hashes
     a few tensors (the first, the smallest, one in the middle, the last); every sha256 must
     equal that of the bytes written into the file, and every dict must hold every tensor.
"""
from __future__ import annotations

import argparse
import hashlib
import json
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
import fs  # noqa: E402  bench/fs.py: the machine with its GPU (nvidia-smi)

from gpumemctl.protocol import UsageError  # noqa: E402
from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402
from tests import harness  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
NAME = "tensorbench/model"
TARGET_LOAD = 0.8               # gpumemctl load vs the pinned host->device copy
TARGET_READY_MS = 50.0          # fresh process to a ready state dict, p50
SLACK = 64 * MiB                # the random buffer is the largest tensor plus this
STEP = 4096 * 37                # where each tensor's bytes start in the buffer (mod SLACK)
DTYPES = {"bf16": ("bfloat16", 2), "f16": ("float16", 2)}
say, gbps = core.say, core.gbps


class Failed(RuntimeError):
    """The benchmark itself failed, or a check did (not a missed target)."""


# ---- the file -----------------------------------------------------------------------------------
def layout(size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and shapes of a Llama-style model of at most `size` bytes of 2-byte
    elements: the embedding, as many layers' tensors as fit (the last layer may be partial),
    the final norm and the head."""
    if size >= 8 * GiB:
        h, vocab, inter, kv = 4096, 128256, 14336, 1024       # Llama-3-8B's shapes
    elif size >= 384 * MiB:
        h, vocab, inter, kv = 2048, 32000, 8192, 512
    else:
        h, vocab, inter, kv = 1024, 32000, 4096, 256
    first = [("model.embed_tokens.weight", (vocab, h))]
    last = [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    nbytes = lambda shape: 2 * _prod(shape)                     # noqa: E731
    total = sum(nbytes(s) for _, s in first + last)
    if total > size:
        raise Failed(f"--size {format_size(size)} is too small: the embedding and the head "
                     f"alone take {format_size(total)}")
    layers = []
    i = 0
    while True:
        p = f"model.layers.{i}."
        for name, shape in ((p + "input_layernorm.weight", (h,)),
                            (p + "self_attn.q_proj.weight", (h, h)),
                            (p + "self_attn.k_proj.weight", (kv, h)),
                            (p + "self_attn.v_proj.weight", (kv, h)),
                            (p + "self_attn.o_proj.weight", (h, h)),
                            (p + "post_attention_layernorm.weight", (h,)),
                            (p + "mlp.gate_proj.weight", (inter, h)),
                            (p + "mlp.up_proj.weight", (inter, h)),
                            (p + "mlp.down_proj.weight", (h, inter))):
            if total + nbytes(shape) > size:
                return first + layers + last
            layers.append((name, shape))
            total += nbytes(shape)
        i += 1


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def make_file(path: str, size: int, dtype: str) -> dict:
    """The model file, written by safetensors.numpy.save_file from views of one random
    buffer; the sha256 of the tensors the checks compare (`check`), and what the children
    touch (`touch`: the tensor last in the file)."""
    import numpy as np
    import safetensors
    import safetensors.numpy
    np_name, itemsize = DTYPES[dtype]
    if np_name == "bfloat16":
        import ml_dtypes
        np_dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        np_dtype = np.dtype(np_name)
    shapes = layout(size)
    largest = max(itemsize * _prod(s) for _, s in shapes)
    say(f"generating {format_size(largest + SLACK)} of random bytes")
    rng = np.random.default_rng(17)
    buf = rng.bit_generator.random_raw((largest + SLACK) // 8).view(np.uint8)
    tensors = {}
    for k, (name, shape) in enumerate(shapes):
        at = (k * STEP) % SLACK
        n = itemsize * _prod(shape)
        tensors[name] = buf[at:at + n].view(np_dtype).reshape(shape)
    total = sum(t.nbytes for t in tensors.values())
    say(f"writing {len(tensors)} {dtype} tensors ({format_size(total)}) to {path} with "
        f"safetensors {safetensors.__version__}")
    t0 = time.perf_counter()
    safetensors.numpy.save_file(tensors, path)
    write_s = time.perf_counter() - t0
    # The library orders the tensors in the file itself: the checks follow its header.
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as st:
        keys = list(st.keys())
    if sorted(keys) != sorted(tensors):
        raise Failed(f"{path}: the safetensors library reads back {len(keys)} tensors, "
                     f"{len(tensors)} were written")
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    order = sorted(header, key=lambda n: header[n]["data_offsets"][0])
    smallest = min(order, key=lambda n: tensors[n].nbytes)
    check = list(dict.fromkeys([order[0], smallest, order[len(order) // 2], order[-1]]))
    sums = {n: hashlib.sha256(memoryview(tensors[n].reshape(-1).view(np.uint8))).hexdigest()
            for n in check}
    return {"path": path, "dtype": dtype, "tensors": len(tensors), "bytes": total,
            "file_bytes": os.path.getsize(path), "write_s": write_s,
            "largest_tensor": largest, "touch": order[-1], "check": sums,
            "safetensors": safetensors.__version__}


# ---- the yardsticks -----------------------------------------------------------------------------
def phase_pinned(device: int, runs: int = 2) -> dict:
    """bench/gpu.py's pinned cuMemcpyHtoD of 256 MiB in this process, best of `runs`."""
    import gpu  # bench/gpu.py (imports the CUDA driver bindings: cuda only)
    results = [gpu.phase_pinned(device) for _ in range(runs)]
    return {"runs": results, "gbps": max(r["h2d_gbps"] for r in results),
            "what": "pinned copy host->device (bench/gpu.py: cuMemcpyHtoD, 256 MiB)"}


def phase_tmpfs(src: str, shm: str, runs: int = 2) -> dict:
    """bench/snapshot.py's dd bs=16M copy of the file into a new /dev/shm file."""
    import snapshot  # bench/snapshot.py
    result = snapshot.phase_tmpfs_baseline(src, shm, runs)
    return {**result, "what": "dd copy of the file bs=16M /dev/shm -> /dev/shm"}


# ---- gpumemctl load -----------------------------------------------------------------------------
def gpumemctl_json(d: core.Daemon, *args: str) -> tuple[dict, float]:
    """`gpumemctl --socket S ARGS --json` as installed; its JSON and the process's wall time."""
    argv = core.console_script("gpumemctl") + ["--socket", d.socket, *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=core.clean_env(),
                          stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise Failed(f"gpumemctl {' '.join(args)} exited {proc.returncode}:\n"
                     f"{proc.stderr.decode(errors='replace')[-3000:]}")
    try:
        return json.loads(proc.stdout), wall
    except ValueError:
        raise Failed(f"gpumemctl {' '.join(args)} printed no JSON: "
                     f"{proc.stdout[:300]!r}") from None


def phase_load(d: core.Daemon, model: dict, ecc: str, runs: int, device: int | None,
               keep: bool) -> dict:
    """`gpumemctl load --durable --ecc ECC` `runs` times (removed between runs; the last
    kept when `keep`)."""
    results = []
    for n in range(runs):
        say(f"gpumemctl load {format_size(model['bytes'])} --ecc {ecc}, run {n + 1}/{runs}")
        args = ["load", model["path"], NAME, "--durable", "--ecc", ecc]
        if device is not None:
            args += ["--device", str(device)]
        result, wall = gpumemctl_json(d, *args)
        with d.client() as c:
            info = c.info(NAME)
            if info.get("state") != "ready" or info.get("ecc") != ecc or \
                    info.get("size") != model["bytes"]:
                raise Failed(f"after gpumemctl load, {NAME} is {info.get('state')}, ecc "
                             f"{info.get('ecc')}, {info.get('size')} bytes; expected ready, "
                             f"ecc {ecc}, {model['bytes']} bytes")
            if not keep or n + 1 < runs:
                c.remove(NAME)
        if result.get("bytes") != model["bytes"] or result.get("tensors") != model["tensors"]:
            raise Failed(f"gpumemctl load reported {result.get('bytes')} bytes and "
                         f"{result.get('tensors')} tensors; the file has {model['bytes']} "
                         f"and {model['tensors']}")
        copy_s = result.get("copy_seconds") or 0.0
        steps = _steps(result)
        results.append({"seconds": result["seconds"], "wall_s": wall, "steps": steps,
                        "copy_s": copy_s, "copy_gbps": gbps(model["bytes"], copy_s)
                        if copy_s else 0.0,
                        "gbps": gbps(model["bytes"], result["seconds"]),
                        "wall_gbps": gbps(model["bytes"], wall)})
    best = min(results, key=lambda r: r["seconds"])
    return {"ecc": ecc, "runs": results, "gbps": best["gbps"], "seconds": best["seconds"],
            "wall_gbps": max(r["wall_gbps"] for r in results),
            "wall_s": min(r["wall_s"] for r in results),
            "copy_gbps": best["copy_gbps"], "steps": best["steps"]}


def _steps(result: dict) -> dict:
    """Where the command's seconds went, summed over its allocations: `create` (the refill:
    memory, parity, mapping it here), `copy` (the file's bytes to the memory, parity reports
    included), `finish` (the close: the parity not encoded during the copy, the commit, a
    durable one's deposit)."""
    out = {"create": 0.0, "copy": 0.0, "finish": 0.0}
    for alloc in result.get("allocations") or []:
        for step in out:
            out[step] += (alloc.get("seconds") or {}).get(step) or 0.0
    return out


# ---- fresh processes ----------------------------------------------------------------------------
# The child: its framework (and on cuda the CUDA context) first, timed on their own; then the
# figure: the import of the loader, the load, and one element of the last tensor read back.
CHILD = r"""
import hashlib, json, sys, time
a = json.loads(sys.argv[1])
out = {}
torch = None
t0 = time.perf_counter()
if a["framework"] == "torch":
    import torch
    out["framework_version"] = torch.__version__
else:
    import numpy
    out["framework_version"] = numpy.__version__
out["framework_import_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
dev = "cpu"
if a["backend"] == "cuda":
    dev = torch.device("cuda", a["device"])
    torch.cuda.init()
    torch.zeros(1, device=dev)
    torch.cuda.synchronize(dev)
out["cuda_init_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
if a["kind"] == "tensors":
    import gpumemctl.tensors
    t1 = time.perf_counter()
    sd = gpumemctl.tensors.load(a["name"], framework=a["framework"])
elif torch is not None:
    import safetensors.torch
    t1 = time.perf_counter()
    sd = safetensors.torch.load_file(a["file"], device=str(dev))
else:
    import safetensors.numpy
    t1 = time.perf_counter()
    sd = safetensors.numpy.load_file(a["file"])
t2 = time.perf_counter()
x = sd[a["touch"]].reshape(-1)[0]
if torch is not None:
    x = x.item()
    if a["backend"] == "cuda":
        torch.cuda.synchronize(dev)
else:
    x = float(x)
t3 = time.perf_counter()
out.update(import_s=t1 - t0, load_s=t2 - t1, touch_s=t3 - t2, ready_s=t3 - t0,
           tensors=len(sd), bytes=sum(int(t.nbytes) for t in sd.values()))
if a["check"]:
    sums = {}
    for name in a["check"]:
        t = sd[name].reshape(-1)
        if torch is not None:
            t = t.view(torch.uint8).cpu().numpy()
        else:
            t = t.view("u1")
        sums[name] = hashlib.sha256(memoryview(t)).hexdigest()
    out["sha256"] = sums
print(json.dumps(out))
"""


def child(d: core.Daemon, model: dict, kind: str, framework: str, backend: str,
          device: int, check: bool = False) -> dict:
    spec = {"kind": kind, "name": NAME, "file": model["path"], "framework": framework,
            "backend": backend, "device": device, "touch": model["touch"],
            "check": list(model["check"]) if check else []}
    env = core.clean_env()
    env["GPUMEMD_SOCKET"] = d.socket          # gpumemctl.tensors.load's daemon
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True,
                          env=env, stdin=subprocess.DEVNULL, timeout=1800)
    wall = time.perf_counter() - t0
    what = "gpumemctl.tensors.load" if kind == "tensors" else "safetensors load_file"
    if proc.returncode != 0:
        raise Failed(f"the fresh process running {what} exited {proc.returncode}:\n"
                     f"{proc.stderr.decode(errors='replace')[-3000:]}")
    try:
        out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Failed(f"the fresh process running {what} printed no result: "
                     f"{proc.stdout[-300:]!r} {proc.stderr[-1000:]!r}") from None
    if out["tensors"] != model["tensors"] or out["bytes"] != model["bytes"]:
        raise Failed(f"{what} gave {out['tensors']} tensors of {out['bytes']} bytes; the "
                     f"file has {model['tensors']} of {model['bytes']}")
    out["wall_s"] = wall
    return out


def phase_fresh(d: core.Daemon, model: dict, framework: str, backend: str, device: int,
                runs: int) -> dict:
    """One warm-up of each kind, then `runs` of each, alternating."""
    kinds = ("tensors", "safetensors")
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for n in range(runs + 1):
        for kind in kinds:
            label = "warm-up" if n == 0 else f"run {n}/{runs}"
            say(f"fresh process: {kind}, {label}")
            r = child(d, model, kind, framework, backend, device)
            if n:
                results[kind].append(r)
    out = {}
    for kind in kinds:
        rs = results[kind]
        out[kind] = {"runs": rs, "framework_version": rs[0]["framework_version"],
                     **{f"{key}_p50_s": core.pct([r[key] for r in rs], 50)
                        for key in ("ready_s", "import_s", "load_s", "touch_s",
                                    "framework_import_s", "cuda_init_s", "wall_s")}}
    return out


def phase_check(d: core.Daemon, model: dict, framework: str, backend: str, device: int,
                kinds: tuple[str, ...], what: str) -> dict:
    """A child of each kind hashes the check tensors; each sha256 must be the file's."""
    out = {}
    for kind in kinds:
        say(f"check: sha256 of {len(model['check'])} tensors via {kind} ({what})")
        got = child(d, model, kind, framework, backend, device, check=True)["sha256"]
        bad = [n for n, h in model["check"].items() if got.get(n) != h]
        if bad:
            raise Failed(f"{kind} ({what}): tensor {bad[0]!r} differs from the file's "
                         f"({len(bad)} of {len(model['check'])} checked tensors differ)")
        out[kind] = sorted(got)
    return out


# ---- report -------------------------------------------------------------------------------------
def rows_from(fig: dict) -> list[dict]:
    rows: list[dict] = []
    c, model, base = fig["config"], fig["model"], fig["baseline"]
    size = format_size(model["bytes"])
    cuda = c["backend"] == "cuda"

    def row(what, measured, baseline="", ratio="", target="", met=""):
        rows.append({"what": what, "measured": measured, "baseline": baseline,
                     "ratio": ratio, "target": target, "met": met})

    def gb(v: float) -> str:
        return f"{v:.2f} GB/s"

    def ms(s: float) -> str:
        return f"{s * 1e3:.1f} ms"

    base_short = "pinned H->D" if cuda else "tmpfs dd"
    row(f"baseline: {base['what']}", gb(base["gbps"]))
    if "load_cold" in fig:
        cold = fig["load_cold"]
        row(f"first gpumemctl load {size} into a fresh gpumemd, --ecc none (not timed "
            "below: the device's first use of that memory)", gb(cold["gbps"]),
            "", f"{cold['gbps'] / base['gbps']:.2f}x")
    for ecc in ("none", "rs"):
        ld = fig[f"load_{ecc}"]
        ratio = ld["gbps"] / base["gbps"]
        # The target is the GPU's: on host the yardstick is a tmpfs copy, no target.
        row(f"gpumemctl load {size} --ecc {ecc} (the command's seconds)", gb(ld["gbps"]),
            f"{gb(base['gbps'])} {base_short}", f"{ratio:.2f}x",
            f">= {TARGET_LOAD:g}x" if cuda else "",
            ("met" if ratio >= TARGET_LOAD else "missed") if cuda else "")
        if ld.get("copy_gbps"):
            row("  of which the copy alone, file -> memory (the command's copy_seconds)",
                gb(ld["copy_gbps"]), "", f"{ld['copy_gbps'] / base['gbps']:.2f}x")
        row("  whole process, start-up included (wall time)", gb(ld["wall_gbps"]),
            "", f"{ld['wall_gbps'] / base['gbps']:.2f}x")
        if ld.get("steps"):
            st = ld["steps"]
            row("  the command's seconds: create / copy / finish",
                " / ".join(ms(st[k]) for k in ("create", "copy", "finish")))

    fr = fig["fresh"]
    t, s = fr["tensors"], fr["safetensors"]
    n = len(t["runs"])
    row(f"fresh process: import gpumemctl.tensors + tensors.load({c['framework']}) of "
        f"{model['tensors']} tensors + one element read, p50 of {n}", ms(t["ready_s_p50_s"]),
        "", "", f"<= {TARGET_READY_MS:g} ms",
        "met" if t["ready_s_p50_s"] * 1e3 <= TARGET_READY_MS else "missed")
    row("  of which import gpumemctl.tensors p50", ms(t["import_s_p50_s"]))
    row("  of which tensors.load p50 (connect, attach, map, views)", ms(t["load_s_p50_s"]))
    loader = (f"safetensors.torch.load_file(device=\"{'cuda' if cuda else 'cpu'}\")"
              if c["framework"] == "torch" else "safetensors.numpy.load_file")
    row(f"fresh process: import + {loader} + one element read, p50 of {n}",
        ms(s["ready_s_p50_s"]), "", "", "", "")
    row("  as a rate", gb(gbps(model["bytes"], s["ready_s_p50_s"])))
    row("  speedup of tensors.load over it (p50 / p50)",
        f"{s['ready_s_p50_s'] / t['ready_s_p50_s']:.1f}x")
    row(f"excluded above: import {c['framework']} p50 (tensors / safetensors children)",
        f"{ms(t['framework_import_s_p50_s'])} / {ms(s['framework_import_s_p50_s'])}")
    if cuda:
        row("excluded above: CUDA context, torch.zeros(1, device=\"cuda\") p50",
            f"{ms(t['cuda_init_s_p50_s'])} / {ms(s['cuda_init_s_p50_s'])}")
    row("  whole child process p50 (interpreter start-up and all)",
        f"{ms(t['wall_s_p50_s'])} / {ms(s['wall_s_p50_s'])}")
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    m, c, model = fig["machine"], fig["config"], fig["model"]
    gpu = f"{m['gpu']} (1 of {m['gpu_count']})" if m["gpu"] else "no GPU (nvidia-smi)"
    print(f"gpumemctl tensors benchmark - {gpu}; {m['cpu_model']}, {m['nproc']} cores, "
          f"{m['mem_gib']} GiB RAM, Linux {m['kernel']}, load average at start "
          f"{m['loadavg_at_start'][0]}")
    fw = fig["fresh"]["tensors"]["framework_version"]
    print(f"gpumemd --backend {c['backend']}"
          + (f" (device {c['device']})" if c["backend"] == "cuda" else "")
          + f"; {model['tensors']} {model['dtype']} tensors, {format_size(model['bytes'])} "
          f"in {model['path']} (largest {format_size(model['largest_tensor'])}), written by "
          f"safetensors {model['safetensors']}; {c['framework']} {fw}; GB/s = 10^9 bytes/s; "
          f"total run {fig['wall_s']:.1f} s")
    for line in core.markdown_table(rows, ["what", "measured", "baseline", "ratio", "target",
                                           "met"]):
        print(line)
    judged = [r for r in rows if r["target"]]
    missed = [r["what"] for r in judged if r["met"] == "missed"]
    print(f"targets: {len(judged) - len(missed)} of {len(judged)} met"
          + (f"; missed: {'; '.join(missed)}" if missed else ""))
    checked = fig["checks"]
    print(f"checked (sha256 equal to the bytes written to the file): "
          f"{', '.join(model['check'])}; through {', '.join(checked)}; every dict held all "
          f"{model['tensors']} tensors ({model['bytes']} bytes)")


# ---- main ---------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("host", "cuda"), default=None,
                   help="gpumemd backend (default: cuda if a GPU is usable, else host)")
    p.add_argument("--size", default=None,
                   help="bytes of tensors in the file (default 16G on cuda, 512M on host)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="the tensors' dtype (default bf16 on cuda, f16 on host: "
                        "safetensors.numpy cannot read bf16)")
    p.add_argument("--framework", choices=("torch", "numpy"), default=None,
                   help="the fresh processes' framework (default torch on cuda, numpy on "
                        "host)")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--runs", type=int, default=7,
                   help="fresh processes of each kind timed (default 7; p50)")
    p.add_argument("--load-runs", type=int, default=1,
                   help="gpumemctl load runs per ecc mode (default 1; best)")
    p.add_argument("--shm-dir", default="/dev/shm",
                   help="where the file goes (a fresh directory in it)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--keep", action="store_true",
                   help="keep the daemon's temp dir (log, registry); the file goes")
    args = p.parse_args(argv)
    if args.runs < 1 or args.load_runs < 1:
        p.error("--runs and --load-runs must be at least 1")
    args.backend = args.backend or ("cuda" if harness.usable_gpus() > 0 else "host")
    cuda = args.backend == "cuda"
    try:
        args.size = parse_size(args.size or ("16G" if cuda else "512M"))
    except UsageError as exc:
        p.error(str(exc))
    args.dtype = args.dtype or ("bf16" if cuda else "f16")
    args.framework = args.framework or ("torch" if cuda else "numpy")
    if cuda and args.framework == "numpy":
        p.error("numpy cannot hold GPU memory: use --framework torch with --backend cuda")
    if args.framework == "numpy" and args.dtype == "bf16":
        p.error("safetensors.numpy.load_file cannot read bf16: use --dtype f16 with numpy")
    if not os.path.isdir(args.shm_dir):
        p.error(f"--shm-dir {args.shm_dir}: no such directory")
    return args


def check_space(shm: str, size: int, backend: str) -> None:
    """The file (twice on host: the dd baseline copies it) and some room."""
    need = size * (2 if backend == "host" else 1) + 256 * MiB
    free = shutil.disk_usage(shm).free
    if free < need:
        raise SystemExit(f"bench/tensors.py: {shm} has {format_size(free)} free, "
                         f"{format_size(need)} needed (use --size or --shm-dir)")


def check_imports(framework: str) -> None:
    """What the children need, asked before anything is made (a clear message, not a child's
    traceback after minutes of setup)."""
    mods = ["safetensors", "numpy", framework] + (["ml_dtypes"] if framework == "numpy"
                                                  else [])
    code = "import importlib, sys\n" \
           "for m in sys.argv[1:]:\n" \
           "    importlib.import_module(m)\n"
    proc = subprocess.run([sys.executable, "-c", code, *dict.fromkeys(mods)],
                          capture_output=True, text=True, env=core.clean_env())
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"bench/tensors.py: {sys.executable} cannot import what the "
                         f"benchmark needs ({', '.join(mods)}): {last}")


def run_all(d: core.Daemon, fig: dict, shm: str) -> None:
    c = fig["config"]
    cuda = c["backend"] == "cuda"
    device = c["device"] if cuda else None
    if cuda:
        say("baseline: pinned host->device copy (bench/gpu.py)")
        fig["baseline"] = phase_pinned(c["device"])
    model = make_file(os.path.join(shm, "model.safetensors"), c["size"], c["dtype"])
    fig["model"] = model
    if not cuda:
        say("baseline: dd copy of the file within /dev/shm (bench/snapshot.py)")
        fig["baseline"] = phase_tmpfs(model["path"], shm)
    say(f"starting gpumemd --backend {c['backend']} in {d.base}")
    try:
        d.start(timeout=120)
    except AssertionError as exc:      # the harness's: gpumemd exited, or never served
        raise Failed(f"gpumemd --backend {c['backend']} did not start: {exc}") from None
    fw, be, dev = c["framework"], c["backend"], c["device"]
    # The first load into a fresh daemon is slower on a GPU (its first use of that device
    # memory): once, on its own row, so that the rows below compare like with like.
    fig["load_cold"] = phase_load(d, model, "none", 1, device, keep=False)
    fig["load_none"] = phase_load(d, model, "none", c["load_runs"], device, keep=True)
    fig["fresh"] = phase_fresh(d, model, fw, be, dev, c["runs"])
    fig["checks"] = []
    phase_check(d, model, fw, be, dev, ("tensors", "safetensors"), "--ecc none")
    fig["checks"] += ["tensors.load of the --ecc none allocation", "safetensors load_file"]
    with d.client() as cl:
        cl.remove(NAME)
    fig["load_rs"] = phase_load(d, model, "rs", c["load_runs"], device, keep=True)
    phase_check(d, model, fw, be, dev, ("tensors",), "--ecc rs")
    fig["checks"].append("tensors.load of the --ecc rs allocation")
    with d.client() as cl:
        cl.remove(NAME)


def main(argv=None) -> int:
    args = parse_args(argv)
    check_space(args.shm_dir, args.size, args.backend)
    check_imports(args.framework)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-tensorbench-", dir="/tmp")
    shm = None
    d = core.Daemon(base, backend=args.backend)
    fig: dict = {"machine": fs.machine(args.backend), "base_dir": base,
                 "config": {"backend": args.backend, "size": args.size, "dtype": args.dtype,
                            "framework": args.framework, "device": args.device,
                            "runs": args.runs, "load_runs": args.load_runs}}
    if args.backend == "cuda":      # the GPU used, where there are several
        name = fs.nvidia_smi("-i", str(args.device), "--query-gpu=name",
                             "--format=csv,noheader")
        fig["machine"]["gpu"] = name or fig["machine"]["gpu"]
    started = time.perf_counter()
    try:
        shm = tempfile.mkdtemp(prefix="gpumemctl-tensorbench-", dir=args.shm_dir)
        run_all(d, fig, shm)
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
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
        if args.keep:
            say(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    rows = rows_from(fig)
    core.emit(fig, rows, args.json, print_table)
    missed = any(r["met"] == "missed" for r in rows)
    return 1 if (missed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
