"""Parity encoded while a load copies, on a real GPU (issue 29; pytest -m gpu): `gpumemctl
load --ecc rs` of a file of several report units reports what the device has as it copies
(after waiting for the copies in flight), the daemon's CUDA codec encodes those blocks on a
worker thread meanwhile, and the close encodes the rest. The bytes read back as the file's
and `verify` finds every block clean. The host-backend tests of the same rule:
tests/integration/test_load_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpumemctl.refillreport import REPORT_CUDA
from tests.harness import usable_gpus

pytestmark = pytest.mark.gpu

BLOCK = 128 * 1024


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


def test_a_large_rs_load_encodes_during_the_copy_and_verifies_clean(gpu_daemon, tmp_path):
    d = gpu_daemon
    nbytes = 2 * REPORT_CUDA + (5 << 20) + 33          # two reports and a short tail
    data = np.random.default_rng(29).integers(0, 256, nbytes, dtype=np.uint8)
    path = str(tmp_path / "m.safetensors")
    save_file({"w": data}, path)
    out = json.loads(d.cli("load", path, "m", "--durable", "--json", check=True,
                           timeout=300).stdout)
    print(f"\nload: {out['bytes'] / out['seconds'] / 1e9:.2f} GB/s, "
          f"{out['allocations'][0]['seconds']}")
    info = d.cli_json("info", "m")
    assert (info["state"], info["ecc"]) == ("ready", "rs")
    with d.client() as c, c.open("m") as h:
        assert h.read() == data.tobytes()
    result = json.loads(d.cli("verify", "m", "--json", check=0).stdout)["allocations"][0]
    assert result["clean"] == result["blocks"] == -(-nbytes // BLOCK)
    assert "'m': parity of blocks 0-" in d.log()            # encoded during the copy
