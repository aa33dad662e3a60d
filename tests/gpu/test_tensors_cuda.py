"""Model weights on a real GPU (run on the GPU machine: pytest -m gpu): `gpumemctl load` of a
safetensors file, then torch and cupy state dicts from gpumemctl.tensors equal to what the
safetensors library itself loads; a writer killed while it holds `mode="rw"` tensors; both
data paths of load (a large file's parallel reads, the staging buffers for the rest)."""
from __future__ import annotations

import json
import signal
import subprocess
import textwrap

import pytest

from gpumemctl.protocol import UsageError
from tests.harness import PYTHON, ROOT, child_env, usable_gpus, wait_for

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


def model(big: bool = False) -> dict:
    g = torch.Generator().manual_seed(5)
    out = {
        "embed": torch.randn(1000, 64, generator=g).to(torch.bfloat16),
        "w16": torch.randn(64, 64, generator=g).to(torch.float16),
        "w32": torch.randn(64, 3, generator=g),
        "ids": torch.arange(-7, 93, dtype=torch.int64),
        "mask": torch.rand(9, generator=g) > 0.5,
        "scale": torch.tensor(0.5),
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    if big:       # large enough for the parallel upload (>= 256 MiB)
        out["big"] = torch.randn(300 << 20 >> 1, generator=g).to(torch.bfloat16)
    return out


def holders(d, name: str) -> list[str]:
    with d.client() as c:
        return [h["kind"] for h in c.info(name)["holders"]]


def test_torch_and_cupy_dicts_equal_the_librarys_own_load(gpu_daemon, tmp_path):
    import gpumemctl.tensors
    d = gpu_daemon
    path = str(tmp_path / "m.safetensors")
    st_torch.save_file(model(big=True), path, metadata={"format": "pt"})
    out = json.loads(d.cli("load", path, "m", "--json", check=True, timeout=300).stdout)
    print(f"\nload: {out['bytes'] / out['seconds'] / 1e9:.2f} GB/s")
    want = st_torch.load_file(path, device="cuda:0")
    got = gpumemctl.tensors.load("m", framework="torch", socket=d.socket)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].device == v.device and got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape and torch.equal(got[k], v), k
    assert holders(d, "m") == ["attach-r"]
    base = got.attachments[0].ptr
    assert got["w32"].data_ptr() == base + got.index["w32"].start       # in place, no copy
    del got
    wait_for(lambda: holders(d, "m") == [], what="the attachment to go")

    cupy = pytest.importorskip("cupy")
    with pytest.raises(UsageError, match=r"has dtype BF16, which cupy cannot hold"):
        gpumemctl.tensors.load("m", framework="cupy", socket=d.socket)
    plain = {k: v for k, v in model().items() if v.dtype != torch.bfloat16}   # no bf16 in cupy
    st_torch.save_file(plain, str(tmp_path / "plain.safetensors"))
    d.cli("load", str(tmp_path / "plain.safetensors"), "plain", check=True, timeout=300)
    got = gpumemctl.tensors.load("plain", framework="cupy", socket=d.socket)
    assert sorted(got) == sorted(plain)
    for k, v in plain.items():
        assert got[k].shape == tuple(v.shape), k
        assert cupy.asnumpy(got[k]).tobytes() == v.numpy().tobytes(), k
    assert got["w32"].data.ptr == got.attachments[0].ptr + got.index["w32"].start  # in place
    del got
    wait_for(lambda: holders(d, "m") == [] and holders(d, "plain") == [],
             what="the attachments to go")
    saved = str(tmp_path / "back.safetensors")
    d.cli("save", "m", saved, check=True, timeout=300)
    assert open(saved, "rb").read() == open(path, "rb").read()


def test_a_killed_rw_holder_leaves_it_unsealed_and_the_next_reader_sees_the_bytes(
        gpu_daemon, tmp_path):
    import gpumemctl.tensors
    d = gpu_daemon
    path = str(tmp_path / "m.safetensors")
    st_torch.save_file(model(), path)
    d.cli("load", path, "m", "--durable", check=True, timeout=300)
    code = textwrap.dedent("""
        import os, signal, sys, torch, gpumemctl.tensors
        w = gpumemctl.tensors.load("m", framework="torch", mode="rw", socket=sys.argv[1])
        w["w32"].fill_(3.0)
        w["embed"][0].zero_()
        torch.cuda.synchronize()
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([PYTHON, "-c", code, d.socket], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "written\n", proc.stderr
    wait_for(lambda: holders(d, "m") == [], what="the dead writer's session to end")
    assert d.cli_json("info", "m")["unsealed"] is True
    got = gpumemctl.tensors.load("m", framework="torch", socket=d.socket)
    assert bool((got["w32"] == 3.0).all()) and not bool(got["embed"][0].any())
    want = st_torch.load_file(path, device="cuda:0")
    assert torch.equal(got["embed"][1:], want["embed"][1:])
