"""ECC through a cuda gpumemd on the GPU machine (pytest -m gpu): the background scrubber
finds and repairs injected corruption. The codec itself: tests/gpu/test_ecc_gpu.py."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def test_scrubber_on_the_cuda_backend_repairs_injected_damage(daemon_factory):
    from tests.harness import usable_gpus
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    d = daemon_factory(backend="cuda", extra_args=["--enable-fault-injection"])
    data = os.urandom(64 * MiB)
    d.cli("create", "w", "--size", "64M", "--durable", check=True)
    d.cli("write", "w", input=data, check=True)
    d.cli("verify", "w", check=0)
    d.cli("debug", "corrupt", "w", "--offset", str(5 * MiB + 3), "--length", "4096",
          check=True)
    d.cli("debug", "corrupt", "w", "--offset", "100", "--length", "50", "--parity",
          check=True)
    out = d.cli("scrub", "--wait", check=1).stdout.decode()
    print(out)
    assert "2 block(s) repaired" in out
    assert d.cli("read", "w", check=True).stdout == data
    d.cli("verify", "w", check=0)
    assert "GPU ECC codec unavailable" not in d.log()
