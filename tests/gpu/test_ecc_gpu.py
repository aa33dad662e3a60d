"""The CUDA ECC codec (daemon/ecc/gpu.py, kernels.cu) on a real GPU: pytest -m gpu.

Buffers are CuPy arrays (their device pointers go to the codec); random data is made on the GPU.
References: the vectors of docs/ecc.md, the numpy codec (daemon/ecc/cpu.py) where it exists, and the
independent library reedsolo on samples. Without a GPU every test here skips with conftest's one
reason; importing this module needs neither CUDA nor CuPy.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os

import pytest

pytestmark = pytest.mark.gpu

BLOCK, PARITY_BLOCK, CKS = 131072, 8192, 8
GiB = 1 << 30
HAVE_CUPY = importlib.util.find_spec("cupy") is not None
HAVE_REEDSOLO = importlib.util.find_spec("reedsolo") is not None

VECTORS = [   # (name, parity sha256, parity[0:32] hex) from docs/ecc.md ("Test vectors")
    ("shake", "e8aeeca4805bbd57e6c4075ab0db5af8e6cf7407c924fb9670bfa851b34e822e",
     "7feee2cf4a93681ececb38abbfbcf1a709f94dc406ab4f708d1378e1ae80aead"),
    ("zeros", "9f1dcbc35c350d6027f98be0f5c8b43b42ca52b7604459c0c42be3aa88913d47", "00" * 32),
    ("mod251", "dc0111bb09ab6ecdaeeade028b2427218fb9728c56317ad1ccdb6416b873b87c",
     "7a3e7668180df8d9cdf02e9c2850719e3f4f63731b5d714b5a6d1e5903253d76"),
]


def vector_data(name: str) -> bytes:
    if name == "shake":
        return hashlib.shake_256(b"gpumemctl-ecc-v1").digest(BLOCK)
    if name == "zeros":
        return bytes(BLOCK)
    return bytes(i % 251 for i in range(BLOCK))


def cpu_codec():
    try:
        from daemon.ecc import cpu
    except ImportError:
        return None
    return cpu


def np_checksums(data_u8):
    """docs/ecc.md, in numpy: per block s1 = sum w_i, s2 = sum (2i+1) w_i mod 2^32."""
    import numpy as np
    w = data_u8.reshape(-1, BLOCK).view("<u4")
    weights = 2 * np.arange(BLOCK // 4, dtype=np.uint32) + 1
    out = np.empty((len(w), 2), "<u4")
    for b0 in range(0, len(w), 512):
        chunk = w[b0:b0 + 512]
        out[b0:b0 + 512, 0] = chunk.sum(axis=1, dtype=np.uint32)
        out[b0:b0 + 512, 1] = (chunk * weights).sum(axis=1, dtype=np.uint32)
    return out.view(np.uint8).reshape(-1)


def rs_reference():
    import reedsolo
    return reedsolo.RSCodec(nsym=8, nsize=136, fcr=1, prim=0x11D, generator=2, c_exp=8)


# ---- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cp():
    if not HAVE_CUPY:
        pytest.skip("needs cupy for GPU buffers")
    import cupy
    return cupy


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("ecc-cache"))


@pytest.fixture(scope="module")
def codec(cp, cache_dir):
    from daemon.ecc.gpu import GpuCodec
    with cp.cuda.Device(0):
        c = GpuCodec(0, cache_dir)
    yield c
    c.close()


class Bufs:
    """n blocks of data, their parity and checksums on the GPU."""

    def __init__(self, cp, n: int):
        self.cp, self.n = cp, n
        self.data = cp.zeros(n * BLOCK, cp.uint8)
        self.parity = cp.zeros(n * PARITY_BLOCK, cp.uint8)
        self.cks = cp.zeros(n * CKS, cp.uint8)

    @property
    def args(self):
        return self.data.data.ptr, self.parity.data.ptr, self.cks.data.ptr, self.n

    def snapshot(self):
        return self.data.copy(), self.parity.copy(), self.cks.copy()

    def same_as(self, snap) -> bool:
        cp = self.cp
        return bool(cp.array_equal(self.data, snap[0]) and cp.array_equal(self.parity, snap[1])
                    and cp.array_equal(self.cks, snap[2]))


_fill_kernel = None


def fill_random(cp, a, seed: int) -> None:
    """Pseudo-random bytes (splitmix64 of the word index and seed), made on the GPU."""
    global _fill_kernel
    if _fill_kernel is None:
        _fill_kernel = cp.ElementwiseKernel(
            "uint64 seed", "uint32 w",
            """unsigned long long x = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ull;
               x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
               x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
               w = (unsigned int)(x ^ (x >> 31));""",
            "ecc_test_fill")
    _fill_kernel(cp.uint64(seed), a.view(cp.uint32))


def sync(cp):
    cp.cuda.Device(0).synchronize()


# ---- encoding ----------------------------------------------------------------------------------
def test_ecc_md_vectors(cp, codec):
    import numpy as np
    host = np.frombuffer(b"".join(vector_data(name) for name, _, _ in VECTORS), np.uint8)
    # Codeword 1 of the zero block carries the single-codeword vector: message bytes(range(128)).
    host = host.copy()
    host[BLOCK + np.arange(128) * 1024 + 1] = np.arange(128, dtype=np.uint8)
    b = Bufs(cp, 3)
    b.data[:] = cp.asarray(host)
    sync(cp)
    codec.encode(*b.args)
    parity = cp.asnumpy(b.parity)
    for k, (name, sha, head) in enumerate(VECTORS):
        p = parity[k * PARITY_BLOCK:(k + 1) * PARITY_BLOCK].copy()
        if name == "zeros":
            one = bytes(p[np.arange(8) * 1024 + 1])
            assert one.hex() == "e35c80cbff5cb41f"
            p[np.arange(8) * 1024 + 1] = 0
        assert hashlib.sha256(p.tobytes()).hexdigest() == sha, name
        assert p[:32].tobytes().hex() == head, name
    assert cp.asnumpy(b.cks).tobytes() == np_checksums(host).tobytes()
    assert codec.verify(*b.args).tolist() == [0, 0, 0]
    status, fixed = codec.repair(*b.args)
    assert status.tolist() == [0, 0, 0] and fixed.tolist() == [0, 0, 0]


def test_one_gib_matches_cpu_codec(cp, codec):
    """1 GiB of random data: GPU parity and checksums byte-identical to the CPU codec's (or,
    without it, to a numpy checksum and to reedsolo on a sample of codewords)."""
    import numpy as np
    n = GiB // BLOCK
    b = Bufs(cp, n)
    fill_random(cp, b.data, 20261122)
    sync(cp)
    codec.encode(*b.args)
    assert not codec.verify(*b.args).any()
    data = cp.asnumpy(b.data)
    parity = cp.asnumpy(b.parity)
    cks = cp.asnumpy(b.cks)
    del b
    cp.get_default_memory_pool().free_all_blocks()

    cpu = cpu_codec()
    if cpu is not None:
        p_cpu = np.empty_like(parity)
        c_cpu = np.empty_like(cks)
        cpu.encode(data, p_cpu, c_cpu)
        assert hashlib.sha256(parity).hexdigest() == hashlib.sha256(p_cpu).hexdigest()
        assert hashlib.sha256(cks).hexdigest() == hashlib.sha256(c_cpu).hexdigest()
    else:
        assert cks.tobytes() == np_checksums(data).tobytes()
    if HAVE_REEDSOLO:   # and an independent reference on a sample of codewords
        rs, rng = rs_reference(), np.random.default_rng(7)
        for _ in range(48):
            blk, c = int(rng.integers(n)), int(rng.integers(1024))
            msg = data[blk * BLOCK + c: (blk + 1) * BLOCK: 1024]
            want = bytes(rs.encode(msg.tobytes()))[128:]
            got = parity[blk * PARITY_BLOCK + c: (blk + 1) * PARITY_BLOCK: 1024].tobytes()
            assert got == want, (blk, c)


# ---- repair ------------------------------------------------------------------------------------
def inject(cp, b: Bufs, rng, blocks, per_codeword, codewords=None):
    """XOR random nonzero values into `per_codeword` (an int, or (lo, hi) inclusive) distinct
    random positions (0..135: data rows, then parity rows) of the chosen codewords (default:
    all 1024) of each block in `blocks`. Returns {block: symbols damaged}."""
    import numpy as np
    d_idx, d_val, p_idx, p_val, count = [], [], [], [], {}
    for blk in blocks:
        cws = range(1024) if codewords is None else codewords
        total = 0
        for c in cws:
            e = per_codeword if isinstance(per_codeword, int) else int(
                rng.integers(per_codeword[0], per_codeword[1] + 1))
            if not e:
                continue
            pos = rng.choice(136, size=e, replace=False)
            val = rng.integers(1, 256, size=e)
            for k, v in zip(pos, val, strict=True):
                if k < 128:
                    d_idx.append(blk * BLOCK + k * 1024 + c)
                    d_val.append(v)
                else:
                    p_idx.append(blk * PARITY_BLOCK + (k - 128) * 1024 + c)
                    p_val.append(v)
            total += e
        count[blk] = total
    for arr, idx, val in ((b.data, d_idx, d_val), (b.parity, p_idx, p_val)):
        if idx:
            i = cp.asarray(np.array(idx, np.int64))
            arr[i] ^= cp.asarray(np.array(val, np.uint8))
    sync(cp)
    return count


@pytest.mark.parametrize("seed", range(12))
def test_repair_up_to_four_errors_per_codeword(cp, codec, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    n = 48
    b = Bufs(cp, n)
    fill_random(cp, b.data, 1000 + seed)
    sync(cp)
    codec.encode(*b.args)
    clean = b.snapshot()
    blocks = rng.choice(n, size=12, replace=False)
    heavy, light = blocks[:4], blocks[4:]
    count = inject(cp, b, rng, heavy, 4)                               # every codeword: 4
    count.update(inject(cp, b, rng, light, (1, 4),
                        codewords=rng.choice(1024, size=int(rng.integers(1, 200)),
                                             replace=False)))
    status = codec.verify(*b.args)
    assert sorted(np.flatnonzero(status).tolist()) == sorted(int(x) for x in blocks)
    st, fixed = codec.repair(*b.args)
    want_status = np.zeros(n, np.uint8)
    want_fixed = np.zeros(n, np.int64)
    for blk, k in count.items():
        want_status[blk], want_fixed[blk] = 1, k
    assert st.tolist() == want_status.tolist()
    assert fixed.tolist() == want_fixed.tolist()
    assert b.same_as(clean)
    assert not codec.verify(*b.args).any()


def test_repair_matches_cpu_codec(cp, codec):
    """The same damage (correctable, uncorrectable, checksum-only) repaired by both codecs:
    the same statuses, counts and bytes."""
    cpu = cpu_codec()
    if cpu is None:
        pytest.skip("daemon/ecc/cpu.py is not there yet")
    import numpy as np
    rng = np.random.default_rng(99)
    n = 32
    b = Bufs(cp, n)
    fill_random(cp, b.data, 4242)
    sync(cp)
    codec.encode(*b.args)
    inject(cp, b, rng, [1, 2, 3], (0, 4))
    inject(cp, b, rng, [5], 6, codewords=[17])
    inject(cp, b, rng, [5], 2, codewords=[18, 900])
    b.cks[8 * 7] ^= 1
    sync(cp)
    host = [cp.asnumpy(a) for a in (b.data, b.parity, b.cks)]
    st_cpu, fixed_cpu = cpu.repair(*host)
    st_gpu, fixed_gpu = codec.repair(*b.args)
    assert st_gpu.tolist() == st_cpu.tolist()
    assert fixed_gpu.tolist() == fixed_cpu.tolist()
    assert st_gpu[5] == 2 and st_gpu[7] == 1 and fixed_gpu[7] == 0
    for dev, h in zip((b.data, b.parity, b.cks), host, strict=True):
        assert np.array_equal(cp.asnumpy(dev), h)


@pytest.mark.parametrize("where", ["data", "parity"])
def test_repair_4096_byte_burst(cp, codec, where):
    import numpy as np
    rng = np.random.default_rng(5)
    n = 8
    b = Bufs(cp, n)
    fill_random(cp, b.data, 77)
    sync(cp)
    codec.encode(*b.args)
    clean = b.snapshot()
    for blk in (0, 3, 7):
        if where == "data":
            start = blk * BLOCK + int(rng.integers(0, BLOCK - 4096))
            target = b.data
        else:
            start = blk * PARITY_BLOCK + int(rng.integers(0, PARITY_BLOCK - 4096))
            target = b.parity
        noise = cp.asarray(rng.integers(1, 256, 4096, dtype=np.uint8))
        target[start:start + 4096] ^= noise
    sync(cp)
    st, fixed = codec.repair(*b.args)
    assert st.tolist() == [1, 0, 0, 1, 0, 0, 0, 1]
    assert fixed.tolist() == [4096 if s else 0 for s in st.tolist()]
    assert b.same_as(clean)


@pytest.mark.parametrize("errors", [5, 6, 7, 8])
def test_too_many_errors_is_uncorrectable_and_unchanged(cp, codec, errors):
    import numpy as np
    rng = np.random.default_rng(errors)
    n = 6
    b = Bufs(cp, n)
    fill_random(cp, b.data, 31337 + errors)
    sync(cp)
    codec.encode(*b.args)
    clean = b.snapshot()
    inject(cp, b, rng, [2], errors, codewords=[int(rng.integers(1000))])
    inject(cp, b, rng, [2], 3, codewords=[1000, 1001])     # correctable, same block
    count = inject(cp, b, rng, [4], (1, 4), codewords=range(0, 1024, 3))
    damaged = b.snapshot()
    st, fixed = codec.repair(*b.args)
    assert st.tolist() == [0, 0, 2, 0, 1, 0]
    assert fixed.tolist() == [0, 0, 0, 0, count[4], 0]
    # Block 2 exactly as it was damaged; block 4 back to clean.
    assert cp.array_equal(b.data[2 * BLOCK:3 * BLOCK], damaged[0][2 * BLOCK:3 * BLOCK])
    assert cp.array_equal(b.parity[2 * PARITY_BLOCK:3 * PARITY_BLOCK],
                          damaged[1][2 * PARITY_BLOCK:3 * PARITY_BLOCK])
    assert cp.array_equal(b.cks, clean[2])
    assert cp.array_equal(b.data[4 * BLOCK:5 * BLOCK], clean[0][4 * BLOCK:5 * BLOCK])


def test_checksum_only_damage(cp, codec):
    n = 4
    b = Bufs(cp, n)
    fill_random(cp, b.data, 8)
    sync(cp)
    codec.encode(*b.args)
    clean = b.snapshot()
    b.cks[8 * 1 + 5] ^= 0x40
    sync(cp)
    assert codec.verify(*b.args).tolist() == [0, 1, 0, 0]
    st, fixed = codec.repair(*b.args)
    assert st.tolist() == [0, 1, 0, 0] and fixed.tolist() == [0, 0, 0, 0]
    assert b.same_as(clean)


def test_arguments(cp, codec):
    b = Bufs(cp, 1)
    assert codec.verify(b.data.data.ptr, b.parity.data.ptr, b.cks.data.ptr, 0).shape == (0,)
    with pytest.raises(ValueError):
        codec.encode(b.data.data.ptr + 4, b.parity.data.ptr, b.cks.data.ptr, 1)


# ---- the NVRTC cache ---------------------------------------------------------------------------
def test_kernel_cache(cp, codec, cache_dir):
    from daemon.ecc.gpu import GpuCodec
    assert not codec.compiled_from_cache            # the module's fresh cache directory
    assert codec.cache_path and os.path.isfile(codec.cache_path)
    assert os.path.dirname(codec.cache_path) == cache_dir
    assert codec.arch.startswith(("sm_", "compute_"))
    with GpuCodec(0, cache_dir) as second:
        assert second.compiled_from_cache
        assert second.cache_path == codec.cache_path
        b = Bufs(cp, 2)
        fill_random(cp, b.data, 3)
        sync(cp)
        second.encode(*b.args)
        assert codec.verify(*b.args).tolist() == [0, 0]
