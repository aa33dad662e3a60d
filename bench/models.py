#!/usr/bin/env python3
"""Small sharded models (issue 29): the fixed costs of `gpumemctl load` and of a fresh process's
`gpumemctl.tensors.load`, against `from_pretrained(...).cuda()` from the page cache.

    source .gpu/env.sh; python3 bench/models.py                         # GPU machine
    python3 bench/models.py --backend host --runs 3   # any machine
    python3 bench/models.py --json           # the same figures as one JSON document

It writes a random LlamaForCausalLM (bf16, --size, about 320 MB by default) with transformers'
`save_pretrained` in --shards shards into a fresh directory under /dev/shm (the page cache),
starts its own gpumemd (bench/core.py's harness) in a fresh /tmp directory, and removes both at
the end (--keep keeps the daemon's directory). Progress on stderr, the table on stdout.

  1. `gpumemctl load DIR NAME --durable --json`, --load-runs times into new names: the
     process's wall time against the command's own `seconds` (and `copy_seconds`, the
     per-shard create/copy/finish). Then what the wall time beyond `seconds` is made of,
     each measured alone in a fresh process: the interpreter (`python -c pass`), the CLI's
     imports (gpumemctl.cli.typerapp, gpumemctl.weights, safetensors, numpy), and on cuda
     the CUDA start-up that `load` does on a thread (cuInit + primary context, then the
     pinned staging buffers). --py-spy PATH records one load with py-spy (--idle) and lists
     the frames that hold the most wall time.
  2. A fresh process per run (--runs, after one warm-up): import torch and create the CUDA
     context (`torch.zeros(1, device="cuda")`), both timed and excluded; then
     `import gpumemctl.tensors` + `gpumemctl.tensors.load(NAME)` + one element read, and a
     parts run that times the steps one by one: import, gpumemctl's own CUDA init (and
     of it, the import of cuda.bindings.driver), connect, listing, and per shard the
     attach round trip, the mapping (import/reserve/map/access) and its release. In three daemon
     states: right after the loads, after --churn more attaches of every shard (a daemon
     that served many requests), and right after a daemon restart (SIGTERM, start: the
     durable shards adopted).
  3. `LlamaForCausalLM.from_pretrained(DIR, dtype=bfloat16).cuda()` in a fresh process,
     --runs times, imports and CUDA context excluded the same way (on host: no `.cuda()`).

Exit status 0 when the run completed, 1 when it failed (the end of gpumemd's log on stderr).
"""
from __future__ import annotations

import argparse
import collections
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

from gpumemctl.protocol.sizes import format_size, parse_size  # noqa: E402

say = core.say
NAME = "models/m0"
MB = 1_000_000

# ---- the children ----------------------------------------------------------------------------
MAKE = r"""
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, size, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hidden, inter, vocab = 1024, 2816, 32000
outer = 2 * vocab * hidden * 2                        # embedding and head, bf16
layer = (4 * hidden * hidden + 3 * hidden * inter) * 2 + 2 * hidden * 2
layers = max(1, round((size - outer) / layer))
cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                  num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                  tie_word_embeddings=False)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
total = sum(p.numel() * p.element_size() for p in model.parameters())
model.save_pretrained(out, max_shard_size=f"{int(total / (shards - 0.5)) // 1000000 + 1}MB")
print(json.dumps({"bytes": total, "layers": layers}))
"""

TENSORS_LOAD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
cuda = sys.argv[2] == "cuda"
if cuda:
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
import gpumemctl.tensors
t3 = time.perf_counter()
w = gpumemctl.tensors.load(sys.argv[3], framework="torch", socket=sys.argv[1])
t4 = time.perf_counter()
last = w[sorted(w)[-1]]
value = float(last.reshape(-1)[0])
if cuda:
    torch.cuda.synchronize()
t5 = time.perf_counter()
print(json.dumps({"torch": t1 - t0, "context": t2 - t1, "import": t3 - t2, "load": t4 - t3,
                  "read": t5 - t4, "tensors": len(w), "shards": len(w.attachments),
                  "bindings": "cuda.bindings.driver" in sys.modules}))
"""

PARTS = r"""
import json, os, sys, time
import torch
cuda = sys.argv[2] == "cuda"
if cuda:
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
import gpumemctl.tensors as T
from gpumemctl.client import Client
from gpumemctl.hostmap import HostMapping
from gpumemctl.memory import CudaMemory, expect_fds, region_of
t1 = time.perf_counter()
t1b = t1
if cuda:
    import cuda.bindings.driver
    t1b = time.perf_counter()
    from gpumemctl import cudadrv
    cudadrv.init(); cudadrv.primary_context(0)
t2 = time.perf_counter()
c = Client(sys.argv[1], client_name="bench-parts")
t3 = time.perf_counter()
infos = T._shard_infos(c, sys.argv[3])
t4 = time.perf_counter()
shards = []
for info in infos:
    a = time.perf_counter()
    result, fds = c.call_fds("attach", path=info["path"], mode="r", regions=True, extents=True)
    b = time.perf_counter()
    expect_fds("attach", result["info"], fds)
    i = result["info"]
    mem = (CudaMemory(fds, i, False) if cuda else
           HostMapping(fds[0], i["capacity"], False, region_of(i)[0]))
    m = time.perf_counter()
    mem.close()
    c.call("detach", handle=result["handle"])
    e = time.perf_counter()
    shards.append({"attach_rtt": b - a, "map": m - b, "unmap_detach": e - m,
                   "fds": len(fds), "bytes": i["size"]})
c.close()
print(json.dumps({"import": t1 - t0, "cuda_init": t2 - t1, "bindings_import": t1b - t1,
                  "connect": t3 - t2,
                  "listing": t4 - t3, "shards": shards,
                  "bindings": "cuda.bindings.driver" in sys.modules}))
"""

FROM_PRETRAINED = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, transformers
from transformers import LlamaForCausalLM
t1 = time.perf_counter()
cuda = sys.argv[2] == "cuda"
if cuda:
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
m = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
if cuda:
    m = m.cuda(); torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "context": t2 - t1, "load": t3 - t2}))
"""

IMPORTS = r"""
import json, time
t0 = time.perf_counter()
import gpumemctl.cli
t1 = time.perf_counter()
import gpumemctl.cli.typerapp
t2 = time.perf_counter()
import gpumemctl.weights, safetensors, numpy
t3 = time.perf_counter()
print(json.dumps({"cli": t1 - t0, "typerapp": t2 - t1, "weights": t3 - t2}))
"""

WARM = r"""
import json, time
t0 = time.perf_counter()
from gpumemctl import cudadrv
from gpumemctl import memory
cudadrv.init()
t1 = time.perf_counter()
cudadrv.primary_context(0)
t2 = time.perf_counter()
s = memory._take_stager(cudadrv, 0, memory.PIPELINE_CHUNK, memory.PIPELINE_DEPTH)
t3 = time.perf_counter()
s.close()
t4 = time.perf_counter()
print(json.dumps({"init": t1 - t0, "context": t2 - t1, "staging": t3 - t2, "free": t4 - t3}))
"""


def child(code: str, *args: str, env: dict | None = None, timeout: float = 300) -> dict:
    e = core.clean_env()
    e.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=e, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"a child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ms(v: float) -> float:
    return round(v * 1000, 2)


def med(values: list[float]) -> float:
    return core.pct(values, 50)


# ---- phases --------------------------------------------------------------------------------------
def make_model(directory: str, size: int, shards: int) -> dict:
    say(f"writing a random Llama of about {format_size(size)} in {shards} shards to {directory}")
    out = child(MAKE, directory, str(size), str(shards), timeout=600)
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    out["shards"] = len(files)
    out["files"] = {f: os.path.getsize(os.path.join(directory, f)) for f in files}
    for f in os.listdir(directory):        # into the page cache, as from_pretrained reads
        with open(os.path.join(directory, f), "rb") as fh:
            while fh.read(64 << 20):
                pass
    return out


def phase_load(d, model_dir: str, runs: int, backend: str, py_spy: str | None) -> dict:
    argv = core.console_script("gpumemctl") + ["--socket", d.socket]
    out: dict = {"runs": []}
    for i in range(runs):
        name = NAME if i == 0 else f"models/m{i}"
        t0 = time.perf_counter()
        proc = subprocess.run(argv + ["load", model_dir, name, "--durable", "--json"],
                              capture_output=True, text=True, env=core.clean_env())
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"gpumemctl load exited {proc.returncode}: {proc.stderr}")
        rep = json.loads(proc.stdout)
        out["runs"].append({"wall": wall, "seconds": rep["seconds"],
                            "copy_seconds": rep.get("copy_seconds"), "bytes": rep["bytes"],
                            "allocations": [a.get("seconds") for a in rep["allocations"]]})
        say(f"gpumemctl load #{i}: wall {wall:.3f} s, command {rep['seconds']:.3f} s")
    for i in range(1, runs):
        subprocess.run(argv + ["rm", "-r", f"models/m{i}"], check=True, capture_output=True,
                       env=core.clean_env())
    out["python_pass"] = med(core.time_cmd([sys.executable, "-c", "pass"], 5, warmup=1))
    out["imports"] = [child(IMPORTS) for _ in range(3)]
    if backend == "cuda":
        out["warm_up"] = [child(WARM) for _ in range(3)]
    if py_spy:
        out["py_spy"] = spy_on_load(d, argv, model_dir, py_spy)
    return out


def spy_on_load(d, argv: list[str], model_dir: str, py_spy: str) -> dict:
    raw = os.path.join(d.base, "load.pyspy.txt")
    t0 = time.perf_counter()
    proc = subprocess.run([py_spy, "record", "--idle", "--threads", "-r", "1000", "-f", "raw",
                           "-o", raw, "--", *argv, "load", model_dir, "models/spied",
                           "--durable", "--json"],
                          capture_output=True, text=True, env=core.clean_env())
    wall = time.perf_counter() - t0
    subprocess.run(argv + ["rm", "-r", "models/spied"], capture_output=True,
                   env=core.clean_env())
    if proc.returncode != 0 or not os.path.exists(raw):
        return {"error": proc.stderr[-1500:]}
    inclusive: collections.Counter = collections.Counter()
    total_by_thread: collections.Counter = collections.Counter()
    with open(raw) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            total_by_thread[frames[0]] += int(n)
            for frame in set(frames[1:]):
                inclusive[frame] += int(n)
    return {"wall": wall, "threads": dict(total_by_thread.most_common(8)),
            "top": inclusive.most_common(40), "raw": raw}


def churn(d, attaches: int) -> None:
    """Attach and detach every shard of NAME `attaches` times, as many engines would."""
    from gpumemctl.client import Client
    with Client(d.socket) as c:
        paths = [e["path"] for e in c.ls(NAME, recursive=True)]
        for _ in range(attaches):
            for p in paths:
                result, fds = c.call_fds("attach", path=p, mode="r", regions=True,
                                         extents=True)
                for fd in fds:
                    os.close(fd)
                c.call("detach", handle=result["handle"])


def phase_tensors(d, backend: str, runs: int) -> dict:
    out: dict = {}
    for key in ("client",):
        child(TENSORS_LOAD, d.socket, backend, NAME)      # warm-up
        out[key] = [child(TENSORS_LOAD, d.socket, backend, NAME) for _ in range(runs)]
        out[key + "_parts"] = [child(PARTS, d.socket, backend, NAME) for _ in range(2)]
        got = out[key]
        say(f"  tensors.load ({key}): p50 {ms(med([r['load'] for r in got]))} ms "
            f"(import {ms(med([r['import'] for r in got]))} ms, context excluded "
            f"{ms(med([r['context'] for r in got]))} ms)")
    return out


def phase_from_pretrained(model_dir: str, backend: str, runs: int) -> list[dict]:
    child(FROM_PRETRAINED, model_dir, backend)                    # warm-up
    return [child(FROM_PRETRAINED, model_dir, backend) for _ in range(runs)]


def run_all(d, fig: dict, model_dir: str, args) -> None:
    fig["model"] = make_model(model_dir, args.size, args.shards)
    d.start()
    fig["load"] = phase_load(d, model_dir, args.load_runs, args.backend, args.py_spy)
    states = {}
    say("tensors.load right after the loads")
    states["after load"] = phase_tensors(d, args.backend, args.runs)
    say(f"{args.churn} more attaches of every shard")
    t0 = time.perf_counter()
    churn(d, args.churn)
    fig["churn_s"] = time.perf_counter() - t0
    states[f"after {args.churn} attaches"] = phase_tensors(d, args.backend, args.runs)
    say("restarting gpumemd (SIGTERM, start)")
    d.terminate()
    d.start()
    states["after a restart"] = phase_tensors(d, args.backend, args.runs)
    fig["tensors"] = states
    say("from_pretrained baseline")
    fig["from_pretrained"] = phase_from_pretrained(model_dir, args.backend, args.runs)


# ---- the table -----------------------------------------------------------------------------------
def rows_from(fig: dict) -> list[dict]:
    rows = []

    def row(what: str, value: str) -> None:
        rows.append({"what": what, "value": value})

    m = fig["model"]
    row("model", f"{m['bytes'] / MB:.0f} MB, {m['shards']} shards, {m['layers']} layers")
    ld = fig["load"]
    walls = [r["wall"] for r in ld["runs"]]
    secs = [r["seconds"] for r in ld["runs"]]
    copies = [r["copy_seconds"] or 0 for r in ld["runs"]]
    row("gpumemctl load: wall / command seconds / copy (p50)",
        f"{med(walls):.3f} / {med(secs):.3f} / {med(copies):.3f} s")
    row("gpumemctl load: wall beyond the command's seconds (p50)",
        f"{med([w - s for w, s in zip(walls, secs, strict=True)]):.3f} s")
    first = ld["runs"][0]["allocations"]
    row("gpumemctl load #0 per shard create/copy/finish (s)",
        "; ".join("/".join(f"{p.get(k, 0):.3f}" for k in ("create", "copy", "finish"))
                  for p in first if isinstance(p, dict)))
    row("  interpreter start (python -c pass)", f"{ms(ld['python_pass'])} ms")
    imp = ld["imports"]
    row("  imports: gpumemctl.cli / typerapp / weights+safetensors+numpy (p50)",
        " / ".join(f"{ms(med([r[k] for r in imp]))}" for k in ("cli", "typerapp", "weights"))
        + " ms")
    if "warm_up" in ld:
        w = ld["warm_up"]
        row("  CUDA start-up on load's thread: cuInit / context / 6x32 MiB pinned / free",
            " / ".join(f"{ms(med([r[k] for r in w]))}" for k in
                       ("init", "context", "staging", "free")) + " ms")
    if ld.get("py_spy") and "top" in ld["py_spy"]:
        row("  py-spy of one load (wall)", f"{ld['py_spy']['wall']:.3f} s, raw "
            f"{ld['py_spy']['raw']}")
    for state, figs in fig["tensors"].items():
        for key in ("client",):
            got = figs[key]
            row(f"tensors.load {state}, {key}: load p50 (min-max)",
                f"{ms(med([r['load'] for r in got]))} ms ({ms(min(r['load'] for r in got))}-"
                f"{ms(max(r['load'] for r in got))}); import {ms(med([r['import'] for r in got]))}"
                f" ms; read {ms(med([r['read'] for r in got]))} ms; bindings loaded: "
                f"{got[0]['bindings']}")
            parts = figs[key + "_parts"][-1]
            per = parts["shards"]
            row(f"  parts ({key}): import / cuda init (of it, import cuda.bindings.driver)"
                " / connect / listing",
                f"{ms(parts['import'])} / {ms(parts['cuda_init'])} "
                f"({ms(parts['bindings_import'])}) / {ms(parts['connect'])} / "
                f"{ms(parts['listing'])} ms")
            row(f"  parts ({key}): per shard attach rtt / map / unmap+detach",
                "; ".join(f"{ms(s['attach_rtt'])}/{ms(s['map'])}/{ms(s['unmap_detach'])}"
                          for s in per) + " ms")
    excl = fig["tensors"]["after load"]["client"]
    row("excluded: import torch / CUDA context (p50)",
        f"{ms(med([r['torch'] for r in excl]))} / {ms(med([r['context'] for r in excl]))} ms")
    fp = fig["from_pretrained"]
    row("from_pretrained(...)" + (".cuda()" if fig["config"]["backend"] == "cuda" else "")
        + " p50 (min-max)", f"{ms(med([r['load'] for r in fp]))} ms "
        f"({ms(min(r['load'] for r in fp))}-{ms(max(r['load'] for r in fp))}); imports "
        f"{ms(med([r['imports'] for r in fp]))} ms excluded")
    return rows


def print_table(fig: dict, rows: list[dict]) -> None:
    print(f"bench/models.py, backend {fig['config']['backend']}, "
          f"{fig.get('machine', {}).get('gpu') or ''} {time.strftime('%Y-%m-%d %H:%M')}")
    for line in core.markdown_table(rows, ["what", "value"]):
        print(line)
    spy = fig["load"].get("py_spy")
    if spy and "top" in spy:
        print("\npy-spy of one `gpumemctl load`, samples per thread:", spy["threads"])
        print("frames holding the most wall time (inclusive samples at 1 kHz):")
        for frame, n in spy["top"]:
            print(f"{n:7d}  {frame[:150]}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--size", type=parse_size, default=parse_size("320M"))
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--load-runs", type=int, default=3)
    p.add_argument("--churn", type=int, default=200, help="attaches of every shard between "
                   "the first two tensors.load states")
    p.add_argument("--py-spy", default=None, help="py-spy binary: record one load with it")
    p.add_argument("--shm-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # cleans up in finally
    base = tempfile.mkdtemp(prefix="gpumemctl-modelbench-", dir="/tmp")
    model_dir = tempfile.mkdtemp(prefix="gpumemctl-modelbench-", dir=args.shm_dir)
    d = core.Daemon(base, backend=args.backend)
    fig: dict = {"machine": core.machine(), "base_dir": base,
                 "config": {k: v for k, v in vars(args).items() if k != "json"}}
    started = time.perf_counter()
    try:
        run_all(d, fig, model_dir, args)
        fig["wall_s"] = time.perf_counter() - started
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - the run failed: say so, with the daemon's log
        core.show_log_tail(d)
        say(f"error: {type(exc).__name__}: {exc}")
        return 1
    finally:
        d.cleanup()
        shutil.rmtree(model_dir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    core.emit(fig, rows_from(fig), args.json, print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
