"""The engine examples (examples/llama_zero_copy.py, examples/kv_offload.py; docs/engines.md)
run as a reader runs them, against a test gpumemd with small sizes: their exit status and
what they print. They cannot drift from the API unnoticed."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest

from tests.harness import PYTHON, ROOT, child_env


def example(daemon, script: str, *args: str, timeout: float = 240
            ) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, os.path.join(ROOT, "examples", script),
                           "--socket", daemon.socket, *args],
                          env=child_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def tree(daemon) -> list[str]:
    return sorted(e["path"] for e in daemon.cli_json("ls", "-R"))


# ---- kv_offload.py -------------------------------------------------------------------------
@pytest.mark.parametrize("durability", ["transient", "durable"])
def test_kv_offload_round_trips_every_chunk_and_evicts_them(daemon, durability):
    proc = example(daemon, "kv_offload.py", "--chunks", "300", "--chunk-size", "16K",
                   "--batch", "64", "--rounds", "2", "--prefix", "cache/kv",
                   *(["--durable"] if durability == "durable" else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"2 round(s) of 300 chunks of 16K ({durability}), 64 a call" in out, out
    for phase in ("create_many", "write_many", "read_many", "remove_many", "round trip"):
        assert re.search(rf"^  {phase} +[\d.]+ s +\d+ chunks/s", out, re.M), (phase, out)
    assert "checks: all passed" in out
    assert tree(daemon) == ["cache"]            # its own directory removed, nothing left


def test_kv_offload_refuses_a_directory_that_exists(daemon):
    daemon.cli("mkdir", "mine", check=True)
    daemon.cli("create", "mine/keep", "--size", "4K", check=True)
    proc = example(daemon, "kv_offload.py", "--chunks", "4", "--prefix", "mine")
    assert proc.returncode == 1 and "cannot make mine (it must not exist)" in proc.stderr, \
        proc.stdout + proc.stderr
    assert tree(daemon) == ["mine", "mine/keep"]        # nothing of it removed


def test_kv_offload_bad_arguments_are_exit_2(daemon):
    proc = example(daemon, "kv_offload.py", "--chunk-size", "lots")
    assert proc.returncode == 2 and "--chunk-size" not in proc.stdout, proc.stderr


# ---- llama_zero_copy.py --------------------------------------------------------------------
def missing(*modules: str) -> str | None:
    gone = [m for m in modules if importlib.util.find_spec(m) is None]
    return f"needs {' and '.join(gone)} (pip install {' '.join(gone)}): not installed" \
        if gone else None


def test_llama_zero_copy_matches_from_pretrained_and_survives_a_daemon_crash(daemon, tmp_path):
    reason = missing("torch", "transformers")
    if reason:
        pytest.skip(reason)
    model_dir = str(tmp_path / "tiny-llama")
    args = ("--model-dir", model_dir, "--name", "models/tiny")
    proc = example(daemon, "llama_zero_copy.py", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    shards = int(re.search(r"a tiny random Llama \(seed \d+\) in .*: (\d+) safetensors "
                           r"shard\(s\)", out).group(1))
    assert shards >= 3, out
    assert f"in {shards} allocation(s)" in out, out
    for line in ("zero-copy yes", "lm_head tied yes", "on cpu", "torch.bfloat16",
                 "identical (torch.equal)", "checks: all passed"):
        assert line in out, (line, out)
    for name in ("model", "load", "engine", "reference", "compare"):
        assert re.search(rf"^{name} +[\d.]+ ms ", out, re.M), (name, out)
    assert len([p for p in tree(daemon) if p.startswith("models/tiny/")]) == shards

    daemon.kill9()                    # durable: the weights outlive gpumemd
    daemon.start()
    proc = example(daemon, "llama_zero_copy.py", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "models/tiny is there already" in out and "(as it is)" in out, out
    assert "identical (torch.equal)" in out and "checks: all passed" in out, out


def test_llama_zero_copy_fails_when_the_weights_are_not_the_directorys(daemon, tmp_path):
    """Its check can fail: NAME holds a model of another seed than --model-dir's."""
    reason = missing("torch", "transformers")
    if reason:
        pytest.skip(reason)
    other = example(daemon, "llama_zero_copy.py", "--model-dir", str(tmp_path / "a"),
                    "--name", "models/tiny", "--seed", "1")
    assert other.returncode == 0, other.stdout + other.stderr
    proc = example(daemon, "llama_zero_copy.py", "--model-dir", str(tmp_path / "b"),
                   "--name", "models/tiny", "--seed", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "logits DIFFER" in proc.stdout and "checks: FAILED" in proc.stdout, proc.stdout
