#!/usr/bin/env python3
"""A transformers model whose weights stay in gpumemd: loaded once, taken zero-copy by every
engine start, with logits identical to transformers' own loading (docs/engines.md).

    gpumemd --backend auto &                                     # or a running gpumemd
    python3 examples/llama_zero_copy.py --model-dir /tmp/tiny-llama
    python3 examples/llama_zero_copy.py --model-dir ~/models/Llama-3.2-1B --name models/llama-1b

What it does, each step timed:

  1. model: if --model-dir has no config.json, writes a tiny random Llama there
     (LlamaConfig with small sizes, weights seeded by --seed, lm_head tied to embed_tokens,
     bfloat16), with save_pretrained in several safetensors shards (--shard-size). A model
     directory of your own is used as it is (any causal LM that transformers builds).
  2. load: `gpumemctl load DIR NAME --durable`: one allocation per shard under the
     directory NAME. If NAME exists already (a durable model outlives gpumemd's restarts)
     it is used as it is; --replace removes it and loads again.
  3. engine: a fresh process (this script with --engine) builds the model on the meta
     device (no memory, no initialisation), takes `gpumemctl.tensors.load(NAME)` into it
     with `load_state_dict(weights, assign=True)` (the parameters become the views of
     gpumemd's memory: nothing is copied), ties lm_head to embed_tokens as transformers
     does, computes the non-persistent buffers (the rotary embedding's inv_freq), and runs
     a forward pass on fixed input ids. On the host backend the tensors are on the CPU, on
     the cuda backend on the allocation's GPU, in the files' dtype.
  4. reference: a fresh process loads the same directory with
     `AutoModelForCausalLM.from_pretrained(DIR)` (moved to the engine's device) and runs
     the same forward pass.
  5. compare: the logits must be identical (torch.equal), and every parameter of the
     engine's model must be the memory of gpumemd (the tensor that tensors.load returned).

Exit status 0 when both checks pass, 1 when one fails (or a step fails: its error is
printed), 2 for bad arguments. Needs torch and transformers, and gpumemctl's `weights`
extra for `gpumemctl load` (safetensors). The socket: --socket, else $GPUMEMD_SOCKET, else
gpumemd's default.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SEED = 1234
SEQUENCE = 16                   # input ids per row
BATCH = 2


# ==== the engine's side: what an engine does to take its weights zero-copy ======================
def build_on_meta(config, torch):
    """The model's modules with every parameter and buffer on the meta device: no memory
    is allocated and nothing is initialised (the weights come from gpumemd)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=config.dtype)


def take_weights(model, weights, torch) -> None:
    """Make `weights` (gpumemctl.tensors.load's dict) the model's parameters, in place.

    - load_state_dict(assign=True) replaces each meta parameter by the tensor itself
      (a copy_ into a meta parameter would fail, and into a real one would copy);
    - tied weights: safetensors stores a tied pair once (embed_tokens, not lm_head), so
      lm_head.weight is missing from the dict; tie_weights() makes it the same Parameter
      as embed_tokens.weight, as from_pretrained does (with transformers 5 the missing keys
      are passed, so that a checkpoint holding both keeps from_pretrained's choice);
    - non-persistent buffers (the rotary embedding's inv_freq) are in no checkpoint: they
      are made on the weights' device and computed by transformers' own _init_weights of
      their module (what from_pretrained does for them), never touching a parameter.
    """
    import inspect
    result = model.load_state_dict(weights, strict=False, assign=True)
    if result.unexpected_keys:
        raise RuntimeError(f"tensors the model does not have: {result.unexpected_keys[:5]}")
    missing = set(result.missing_keys)
    if "missing_keys" in inspect.signature(model.tie_weights).parameters:
        model.tie_weights(missing_keys=missing, recompute_mapping=False)
    else:                                                   # transformers 4
        model.tie_weights()
    device = next(iter(weights.values())).device
    materialize_buffers(model, device, torch)
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"parameters the weights do not hold (still on meta): {left[:5]}")
    model.eval()


def materialize_buffers(model, device, torch) -> None:
    """Every buffer still on meta, made on `device` and filled by transformers'
    _init_weights for its module. Filled with NaN first: a buffer that _init_weights does
    not set is an error rather than garbage."""
    for name, module in model.named_modules():
        meta = [n for n, b in module.named_buffers(recurse=False) if b is not None and b.is_meta]
        if not meta:
            continue
        if any(p.is_meta for p in module.parameters(recurse=False)):
            raise RuntimeError(f"module {name!r} has parameters still on meta")
        for n in meta:
            old = getattr(module, n)
            fresh = torch.full(old.shape, float("nan"), dtype=old.dtype, device=device) \
                if old.dtype.is_floating_point else torch.zeros_like(old, device=device)
            module.register_buffer(n, fresh, persistent=n not in module._non_persistent_buffers_set)
        model._init_weights(module)
        for n in meta:
            buf = getattr(module, n)
            if buf.dtype.is_floating_point and torch.isnan(buf).any():
                raise RuntimeError(f"buffer {name}.{n} is not computed by transformers' "
                                   "_init_weights: compute it for this model")


def input_ids(config, torch, device):
    """Fixed input ids, the same in every process."""
    ids = (torch.arange(BATCH * SEQUENCE, dtype=torch.int64) * 7919 + 11) % config.vocab_size
    return ids.reshape(BATCH, SEQUENCE).to(device)


def engine_main(a: argparse.Namespace) -> int:
    """A fresh process: the model from gpumemd (--engine gpumem) or from the files
    (--engine reference); the logits saved to --out, the timings printed as JSON."""
    t = {}
    t0 = time.perf_counter()
    import torch
    from transformers import AutoConfig

    import gpumemctl.tensors
    t["imports_s"] = time.perf_counter() - t0
    config = AutoConfig.from_pretrained(a.model_dir)
    out: dict = {"engine": a.engine}
    if a.engine == "gpumem":
        t0 = time.perf_counter()
        weights = gpumemctl.tensors.load(a.name, framework="torch", socket=a.socket)
        t["tensors_load_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = build_on_meta(config, torch)
        t["build_on_meta_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        take_weights(model, weights, torch)
        t["take_weights_s"] = time.perf_counter() - t0
        device = next(iter(weights.values())).device
        params = dict(model.named_parameters(remove_duplicate=False))
        out["zero_copy"] = all(params[k].data_ptr() == v.data_ptr() for k, v in weights.items())
        out["tied"] = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        out["shards"] = len(weights.attachments)
        out["tensors"] = len(weights)
        out["dtype"] = str(next(iter(weights.values())).dtype)
    else:
        from transformers import AutoModelForCausalLM
        device = torch.device(a.device)
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(a.model_dir).to(device)
        model.eval()
        t["from_pretrained_s"] = time.perf_counter() - t0
    ids = input_ids(config, torch, device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        logits = model(ids).logits
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t["forward_s"] = time.perf_counter() - t0
    torch.save(logits.cpu(), a.out)
    out.update(device=str(device), timings=t, logits_shape=list(logits.shape),
               parameters=sum(p.numel() for p in model.parameters()))
    print(json.dumps(out), flush=True)
    return 0


# ==== the driver ================================================================================
class Failed(RuntimeError):
    """A step failed: its message is printed, exit 1."""


def make_tiny_llama(model_dir: str, seed: int, shard_size: str) -> list[str]:
    """A small random Llama (tied embeddings, bfloat16) saved in several shards."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, max_shard_size=shard_size)
    return sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))


def gpumemctl(a: argparse.Namespace, *args: str, check: bool = True
              ) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpumemctl.cli", *(["--socket", a.socket] if a.socket else []),
            *args]
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=a.timeout)
    if check and proc.returncode != 0:
        raise Failed(f"gpumemctl {' '.join(args)} exited {proc.returncode}: "
                     f"{proc.stderr.strip()}")
    return proc


def run_engine(a: argparse.Namespace, engine: str, out: str, device: str = "cpu") -> dict:
    """This script with --engine in a fresh process; its JSON, and its wall time."""
    argv = [sys.executable, os.path.abspath(__file__), "--engine", engine, "--model-dir",
            a.model_dir, "--name", a.name, "--out", out, "--device", device,
            *(["--socket", a.socket] if a.socket else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=a.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise Failed(f"the {engine} engine exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def step(label: str, seconds: float, detail: str = "") -> None:
    print(f"{label:<11} {seconds * 1e3:9.1f} ms  {detail}", flush=True)


def timings(t: dict) -> str:
    return ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in t.items())


def drive(a: argparse.Namespace, work: str) -> list[str]:
    problems = []
    if not os.path.exists(os.path.join(a.model_dir, "config.json")):
        t0 = time.perf_counter()
        files = make_tiny_llama(a.model_dir, a.seed, a.shard_size)
        step("model", time.perf_counter() - t0, f"a tiny random Llama (seed {a.seed}) in "
             f"{a.model_dir}: {len(files)} safetensors shard(s)")
    else:
        step("model", 0.0, f"{a.model_dir} (as it is)")
    exists = gpumemctl(a, "info", a.name, check=False).returncode == 0
    if exists and a.replace:
        gpumemctl(a, "rm", "-r", a.name)
        exists = False
    if exists:
        step("load", 0.0, f"{a.name} is there already (durable weights outlive gpumemd's "
             "restarts): not loaded again")
    else:
        t0 = time.perf_counter()
        loaded = json.loads(gpumemctl(a, "load", a.model_dir, a.name, "--durable",
                                      "--json").stdout)
        step("load", time.perf_counter() - t0,
             f"gpumemctl load {a.model_dir} {a.name} --durable: {loaded['tensors']} tensors, "
             f"{loaded['bytes']} bytes in {len(loaded.get('allocations') or [1])} "
             f"allocation(s) ({loaded['seconds'] * 1e3:.1f} ms in the command)")
    mine = run_engine(a, "gpumem", os.path.join(work, "gpumem.pt"))
    step("engine", mine["wall_s"],
         f"fresh process on {mine['device']}: {mine['tensors']} {mine['dtype']} tensors from "
         f"{mine['shards']} shard(s), zero-copy {'yes' if mine['zero_copy'] else 'NO'}, "
         f"lm_head tied {'yes' if mine['tied'] else 'NO'} ({timings(mine['timings'])})")
    ref = run_engine(a, "reference", os.path.join(work, "reference.pt"), mine["device"])
    step("reference", ref["wall_s"],
         f"fresh process: from_pretrained({a.model_dir}) on {ref['device']} "
         f"({timings(ref['timings'])})")
    import torch
    got = torch.load(os.path.join(work, "gpumem.pt"))
    want = torch.load(os.path.join(work, "reference.pt"))
    same = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    if same:
        detail = f"logits {tuple(got.shape)} {got.dtype}: identical (torch.equal)"
    else:
        diff = (got.float() - want.float()).abs().max().item() if got.shape == want.shape \
            else float("nan")
        detail = (f"logits DIFFER: {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} "
                  f"{want.dtype}, max difference {diff:g}")
        problems.append("the logits differ from from_pretrained's")
    step("compare", 0.0, detail)
    if not mine["zero_copy"]:
        problems.append("the model's parameters are not gpumemctl.tensors.load's tensors")
    if not mine["tied"]:
        problems.append("lm_head is not tied to embed_tokens")
    return problems


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", default=None,
                   help="gpumemd's socket (default: $GPUMEMD_SOCKET, else gpumemd's default)")
    p.add_argument("--model-dir", required=True,
                   help="a transformers model directory; a tiny Llama is written there if it "
                        "has no config.json")
    p.add_argument("--name", default="models/tiny-llama",
                   help="the directory of allocations in gpumemd (default models/tiny-llama)")
    p.add_argument("--replace", action="store_true",
                   help="remove NAME and load it again if it exists")
    p.add_argument("--seed", type=int, default=SEED, help="the tiny model's seed")
    p.add_argument("--shard-size", default="48KB",
                   help="the tiny model's max_shard_size (default 48KB: several shards)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds any one step may take (default 600)")
    p.add_argument("--engine", choices=("gpumem", "reference"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.model_dir = os.path.abspath(os.path.expanduser(a.model_dir))
    if a.engine:
        return a
    import importlib.util
    for module in ("torch", "transformers", "safetensors", "gpumemctl"):
        if importlib.util.find_spec(module) is None:
            p.error(f"{sys.executable} has no module {module}: this example needs torch, "
                    "transformers and gpumemctl with its weights extra")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.engine:
        return engine_main(a)
    with tempfile.TemporaryDirectory(prefix="llama-zero-copy-") as work:
        try:
            problems = drive(a, work)
        except (Failed, subprocess.TimeoutExpired) as exc:
            print(f"llama_zero_copy: error: {exc}", file=sys.stderr)
            return 1
    print("checks: " + ("all passed" if not problems else "FAILED: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
