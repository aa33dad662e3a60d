"""A real model, end to end (issue 28, part 4), on the host backend: a small Llama (random,
seeded, lm_head tied to embed_tokens) saved by transformers in several safetensors shards,
`gpumemctl load --durable` of the directory, then an engine in a fresh process that builds
the model on the meta device and takes `gpumemctl.tensors.load(...)` with
`load_state_dict(assign=True)`: its logits must be identical (torch.equal) to those of
`LlamaForCausalLM.from_pretrained(dir)`, and again after gpumemd is killed with SIGKILL and
restarted (docs/engines.md). The cuda backend's run is tests/gpu/test_model_cuda.py, which
takes its helpers from here.
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

from tests.harness import PYTHON, ROOT, child_env, wait_for

torch = pytest.importorskip("torch", reason="needs torch (pip install torch): not installed")
transformers = pytest.importorskip(
    "transformers", reason="needs transformers (pip install transformers): not installed")

MODEL = "models/llama"
SHARD_SIZE = "40KB"          # the tiny model's ~320 KB in several shards


def save_tiny_llama(directory, seed: int = 0) -> list[str]:
    """A tiny Llama (bfloat16, tied embeddings, random weights from `seed`) saved by
    transformers in several shards; the shard files' names."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(directory), max_shard_size=SHARD_SIZE)
    return sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))


# The engine, in a fresh process: the model on the meta device, the weights from gpumemd.
# argv: socket, name, model dir, the logits' output file.
ENGINE = textwrap.dedent("""
    import json, sys
    import torch
    import gpumemctl.tensors
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    socket, name, model_dir, out = sys.argv[1:5]
    config = LlamaConfig.from_pretrained(model_dir)
    weights = gpumemctl.tensors.load(name, framework="torch", socket=socket)
    device = next(iter(weights.values())).device
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    result = model.load_state_dict(weights, strict=False, assign=True)
    model.tie_weights()                  # lm_head.weight is embed_tokens.weight, stored once
    # inv_freq is a non-persistent buffer: in no checkpoint, on meta; made as from_pretrained
    # makes it (float32, computed from the config), on the weights' device.
    model.model.rotary_emb = LlamaRotaryEmbedding(config).to(device)
    model.eval()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    ids = (torch.arange(32, dtype=torch.int64) * 7919 + 11) % config.vocab_size
    with torch.inference_mode():
        logits = model(ids.reshape(2, 16).to(device)).logits
    torch.save(logits.cpu(), out)
    params = dict(model.named_parameters(remove_duplicate=False))
    print(json.dumps({
        "device": str(device), "shards": len(weights.attachments),
        "dtypes": sorted({str(t.dtype) for t in weights.values()}),
        "devices": sorted({str(t.device) for t in weights.values()}),
        "missing": result.missing_keys, "unexpected": result.unexpected_keys,
        "left_on_meta": left,
        "zero_copy": all(params[k].data_ptr() == v.data_ptr() for k, v in weights.items()),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
    }))
""")

# transformers' own loading of the same files, in a fresh process. argv: model dir, device,
# the logits' output file.
REFERENCE = textwrap.dedent("""
    import sys
    import torch
    from transformers import LlamaForCausalLM

    model_dir, device, out = sys.argv[1:4]
    model = LlamaForCausalLM.from_pretrained(model_dir).to(device).eval()
    ids = (torch.arange(32, dtype=torch.int64) * 7919 + 11) % model.config.vocab_size
    with torch.inference_mode():
        logits = model(ids.reshape(2, 16).to(device)).logits
    torch.save(logits.cpu(), out)
""")


def run_python(code: str, *args: str, timeout: float = 240) -> str:
    proc = subprocess.run([PYTHON, "-c", code, *args], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def engine(daemon, model_dir, out) -> tuple[dict, torch.Tensor]:
    """The engine's report and logits (a fresh process)."""
    report = json.loads(run_python(ENGINE, daemon.socket, MODEL, str(model_dir),
                                   str(out)).strip().splitlines()[-1])
    return report, torch.load(str(out))


def reference(model_dir, out, device: str = "cpu") -> torch.Tensor:
    run_python(REFERENCE, str(model_dir), device, str(out))
    return torch.load(str(out))


def assert_identical(got: torch.Tensor, want: torch.Tensor) -> None:
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert torch.equal(got, want), \
        f"logits differ by up to {(got.float() - want.float()).abs().max().item():g}"


def attach_holders(daemon) -> list[str]:
    with daemon.client() as c:
        return [h["kind"] for e in c.ls(MODEL, recursive=True)
                for h in c.info(e["path"]).get("holders", []) if h["kind"].startswith("attach")]


def test_llama_from_gpumemd_has_the_logits_of_from_pretrained_across_a_crash(daemon, tmp_path):
    model_dir = tmp_path / "llama"
    shards = save_tiny_llama(model_dir)
    assert len(shards) >= 3, shards
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert "model.embed_tokens.weight" in index["weight_map"]
    assert "lm_head.weight" not in index["weight_map"]       # tied: stored once

    out = daemon.cli_json("load", str(model_dir), MODEL, "--durable")
    assert sorted(a["name"] for a in out["allocations"]) == [f"{MODEL}/{s}" for s in shards]
    want = reference(model_dir, tmp_path / "reference.pt")

    report, got = engine(daemon, model_dir, tmp_path / "engine.pt")
    assert report["devices"] == ["cpu"] and report["dtypes"] == ["torch.bfloat16"], report
    assert report["shards"] == len(shards)
    assert report["missing"] == ["lm_head.weight"] and report["unexpected"] == [], report
    assert report["left_on_meta"] == [] and report["zero_copy"] and report["tied"], report
    assert_identical(got, want)
    wait_for(lambda: attach_holders(daemon) == [], what="the engine's attachments to go")

    daemon.kill9()
    daemon.start()
    report, got = engine(daemon, model_dir, tmp_path / "after-crash.pt")
    assert report["zero_copy"] and report["tied"] and report["shards"] == len(shards), report
    assert_identical(got, want)


def test_other_weights_give_other_logits(daemon, tmp_path):
    """The comparison can fail: the same architecture with weights of another seed,
    loaded under the name, is caught."""
    save_tiny_llama(tmp_path / "llama")
    save_tiny_llama(tmp_path / "other", seed=1)
    daemon.cli("load", str(tmp_path / "other"), MODEL, check=True)
    want = reference(tmp_path / "llama", tmp_path / "reference.pt")
    _, got = engine(daemon, tmp_path / "llama", tmp_path / "engine.pt")
    assert got.shape == want.shape and not torch.equal(got, want)
