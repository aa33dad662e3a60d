"""The CUDA ECC codec on the GPU machine (pytest -m gpu tests/gpu/test_ecc_gpu.py): ECC.md's
vectors, parity identical to the numpy codec on 1 GiB, repairs, the NVRTC cache, and the
background scrubber of a cuda gpumemd finding and repairing injected corruption."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MiB, GiB, BLOCK = 1 << 20, 1 << 30, 128 * 1024
VECTORS = [  # (data, parity sha256) from ../shared/ECC.md
    (lambda: hashlib.shake_256(b"gpumemctl-ecc-v1").digest(BLOCK),
     "e8aeeca4805bbd57e6c4075ab0db5af8e6cf7407c924fb9670bfa851b34e822e"),
    (lambda: bytes(BLOCK), "9f1dcbc35c350d6027f98be0f5c8b43b42ca52b7604459c0c42be3aa88913d47"),
    (lambda: bytes(i % 251 for i in range(BLOCK)),
     "dc0111bb09ab6ecdaeeade028b2427218fb9728c56317ad1ccdb6416b873b87c"),
]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    from tests.conftest import usable_gpus
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    cp = pytest.importorskip("cupy")
    from daemon.ecc.cuda_codec import GpuCodec
    from gpumemctl import cudadrv
    cudadrv.make_current(0)
    cache = str(tmp_path_factory.mktemp("ecc-cache"))
    return cp, GpuCodec(0, cache), cache


def device_views(cp, data: bytes):
    n = len(data) // BLOCK
    d = cp.asarray(np.frombuffer(data, np.uint8))
    p = cp.zeros(n * 8192, cp.uint8)
    c = cp.zeros(n * 8, cp.uint8)
    return n, d, p, c


def ptrs(*arrays):
    """Device pointers, after CuPy's own work on them is done (the codec runs on a stream
    of its own, which does not wait for CuPy's)."""
    import cupy as cp
    cp.cuda.Device().synchronize()
    return [a.data.ptr for a in arrays]


def test_vectors_and_checksums(gpu):
    from daemon.ecc import cpu
    cp, codec, _ = gpu
    for make, want in VECTORS:
        data = make()
        n, d, p, c = device_views(cp, data)
        codec.encode(*ptrs(d, p, c), n)
        assert hashlib.sha256(p.get().tobytes()).hexdigest() == want
        assert c.get().tobytes() == cpu.checksum(np.frombuffer(data, np.uint8)).tobytes()
        assert list(codec.verify(*ptrs(d, p, c), n)) == [0]


def test_gpu_and_cpu_parity_identical_on_1gib(gpu):
    from daemon.ecc import cpu
    cp, codec, _ = gpu
    d = cp.random.randint(0, 256, GiB, dtype=cp.uint8)
    n = GiB // BLOCK
    p, c = cp.zeros(n * 8192, cp.uint8), cp.zeros(n * 8, cp.uint8)
    codec.encode(*ptrs(d, p, c), n)
    host = d.get()
    hp, hc = np.zeros(n * 8192, np.uint8), np.zeros(n * 8, np.uint8)
    cpu.encode(host, hp, hc)
    gp, gc = p.get(), c.get()
    print(f"1 GiB: GPU parity sha256 {hashlib.sha256(gp).hexdigest()[:16]}, CPU "
          f"{hashlib.sha256(hp).hexdigest()[:16]}")
    assert np.array_equal(gp, hp) and np.array_equal(gc, hc)
    assert not codec.verify(*ptrs(d, p, c), n).any()


@pytest.mark.parametrize("seed", range(8))
def test_repairs(gpu, seed):
    cp, codec, _ = gpu
    rng = np.random.default_rng(seed)
    n = 16
    data = rng.integers(0, 256, n * BLOCK, dtype=np.uint8)
    _, d, p, c = device_views(cp, data.tobytes())
    codec.encode(*ptrs(d, p, c), n)
    good_p = p.get()
    bad = d.get()
    for b in (1, 5):                                     # <= 4 errors in every codeword
        for cw in range(1024):
            for j in rng.choice(128, rng.integers(1, 5), replace=False):
                bad[b * BLOCK + j * 1024 + cw] ^= rng.integers(1, 256)
    start = 9 * BLOCK + int(rng.integers(0, BLOCK - 4096))   # a 4096-byte burst
    bad[start:start + 4096] ^= 0xA5
    hopeless = bad.copy()
    for cw in range(0, 1024, 7):                         # 5..8 errors: beyond repair
        for j in rng.choice(128, rng.integers(5, 9), replace=False):
            hopeless[12 * BLOCK + j * 1024 + cw] ^= rng.integers(1, 256)
    d.set(hopeless)
    pp = p.get()
    pp[3 * 8192 + 5 * 1024 + 17] ^= 0xFF                 # parity damage, block 3
    p.set(pp)
    status, corrected = codec.repair(*ptrs(d, p, c), n)
    assert [int(s) for s in status] == [0, 1, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 2, 0, 0, 0]
    after = d.get()
    ok = [b for b in range(n) if b != 12]
    for b in ok:
        assert np.array_equal(after[b * BLOCK:(b + 1) * BLOCK], data[b * BLOCK:(b + 1) * BLOCK])
    assert np.array_equal(after[12 * BLOCK:13 * BLOCK], hopeless[12 * BLOCK:13 * BLOCK])
    assert np.array_equal(p.get()[:12 * 8192], good_p[:12 * 8192])


def test_damaged_checksum_alone_is_rewritten(gpu):
    cp, codec, _ = gpu
    data = np.random.default_rng(9).integers(0, 256, 2 * BLOCK, dtype=np.uint8)
    n, d, p, c = device_views(cp, data.tobytes())
    codec.encode(*ptrs(d, p, c), n)
    good = c.get()
    bad = good.copy()
    bad[8 + 3] ^= 0x40                                   # block 1's checksum
    c.set(bad)
    status, corrected = codec.repair(*ptrs(d, p, c), n)
    assert list(status) == [0, 1] and list(corrected) == [0, 0]
    assert np.array_equal(c.get(), good) and np.array_equal(d.get(), data)


def test_verify_refresh_rewrites_stale_parity_of_intact_data(gpu):
    from daemon.ecc import cpu
    cp, codec, _ = gpu
    data = np.random.default_rng(11).integers(0, 256, 3 * BLOCK, dtype=np.uint8)
    n, d, p, c = device_views(cp, data.tobytes())
    codec.encode(*ptrs(d, p, c), n)
    good = p.get()
    pp = good.copy()
    pp[8192: 2 * 8192] = 0                                # block 1: a whole parity block lost
    p.set(pp)
    dd = data.copy()
    dd[2 * BLOCK + 5] ^= 1                                # block 2: data damage
    d.set(dd)
    status = codec.verify_refresh(*ptrs(d, p, c), n)
    assert [int(x) for x in status] == [0, cpu.REFRESHED, cpu.NEEDS_REPAIR]
    after = p.get()
    assert np.array_equal(after[:2 * 8192], good[:2 * 8192])     # block 1 refreshed
    assert np.array_equal(after[2 * 8192:], good[2 * 8192:])     # block 2 untouched


def test_kernels_come_from_the_cache_the_second_time(gpu):
    from daemon.ecc.cuda_codec import GpuCodec
    _, first, cache = gpu
    assert os.path.exists(first.cache_path)
    again = GpuCodec(0, cache)
    assert again.compiled_from_cache and not first.compiled_from_cache


def test_scrubber_on_the_cuda_backend_repairs_injected_damage(daemon_factory):
    from tests.conftest import usable_gpus
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
