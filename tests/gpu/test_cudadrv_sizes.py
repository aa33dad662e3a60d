"""The driver wrapper's size probe on a real GPU: `extends_beyond` tells an allocation larger
than the registry's capacity from one of exactly that capacity (adoption refuses kept memory
that is larger, daemon/backends/cuda.py). On the H100's driver a map at a non-zero offset is
refused outright, which once made the probe answer "no" for every allocation."""
from __future__ import annotations

import pytest

from tests.harness import usable_gpus

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not usable_gpus(), reason="no NVIDIA GPU with VMM support here")]


def test_extends_beyond_tells_a_larger_allocation_from_an_exact_one():
    from gpumemctl import cudadrv

    cudadrv.init()
    index = 0
    g = cudadrv.granularity(index)
    with cudadrv.context(index):
        handle = cudadrv.mem_create(2 * g, index)
    try:
        assert cudadrv.extends_beyond(handle, g, index)
        assert not cudadrv.extends_beyond(handle, 2 * g, index)
    finally:
        with cudadrv.context(index):
            cudadrv.release(handle)
