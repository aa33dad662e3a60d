"""A real model, end to end, on a real GPU (run on the GPU machine: pytest -m gpu): the tiny
Llama of tests/integration/test_examples_llama.py loaded with `gpumemctl load --durable` into
the cuda backend, an engine in a fresh process that builds it on the meta device and takes
`gpumemctl.tensors.load(...)` (tensors on the allocation's GPU) with
`load_state_dict(assign=True)`: logits identical (torch.equal) to
`LlamaForCausalLM.from_pretrained(dir).cuda()`, and again after gpumemd is killed with
SIGKILL and restarted (docs/engines.md)."""
from __future__ import annotations

import pytest

from tests.harness import usable_gpus, wait_for

pytestmark = pytest.mark.gpu

pytest.importorskip("torch", reason="needs torch (pip install torch): not installed")
pytest.importorskip("transformers",
                    reason="needs transformers (pip install transformers): not installed")

from tests.integration.test_examples_llama import (  # noqa: E402  (after the skips)
    MODEL,
    assert_identical,
    attach_holders,
    engine,
    reference,
    save_tiny_llama,
)


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


def test_llama_on_cuda_has_the_logits_of_from_pretrained_across_a_crash(gpu_daemon, tmp_path):
    d = gpu_daemon
    model_dir = tmp_path / "llama"
    shards = save_tiny_llama(model_dir)
    assert len(shards) >= 3, shards
    d.cli("load", str(model_dir), MODEL, "--durable", check=True)
    want = reference(model_dir, tmp_path / "reference.pt", device="cuda:0")

    report, got = engine(d, model_dir, tmp_path / "engine.pt")
    assert report["devices"] == ["cuda:0"] and report["dtypes"] == ["torch.bfloat16"], report
    assert report["shards"] == len(shards) and report["missing"] == ["lm_head.weight"], report
    assert report["left_on_meta"] == [] and report["zero_copy"] and report["tied"], report
    assert_identical(got, want)
    wait_for(lambda: attach_holders(d) == [], what="the engine's attachments to go")

    d.kill9()
    d.start()
    report, got = engine(d, model_dir, tmp_path / "after-crash.pt")
    assert report["devices"] == ["cuda:0"] and report["zero_copy"], report
    assert_identical(got, want)
