"""The numpy ECC codec (daemon/ecc/cpu.py) against docs/ecc.md (its test vectors) and the
independent reedsolo library. No timing here: `python -m daemon.ecc.cpu` measures speed."""
from __future__ import annotations

import hashlib
import mmap
import struct

import numpy as np
import pytest
import reedsolo

from daemon.ecc import cpu
from daemon.ecc.layout import (
    BLOCK,
    CHECKSUM_BYTES,
    CLEAN,
    CODEWORDS,
    CORRECTED,
    MESSAGE,
    NSYM,
    PARITY_BLOCK,
    UNCORRECTABLE,
)

LENGTH = MESSAGE + NSYM


@pytest.fixture(scope="module")
def rs():
    return reedsolo.RSCodec(nsym=8, nsize=136, fcr=1, prim=0x11D, generator=2, c_exp=8)


class Blocks:
    """n encoded blocks, a pristine copy, and addressing by (block, codeword, position)."""

    def __init__(self, n: int, seed: int = 0, data: bytes | None = None):
        self.rng = np.random.default_rng(seed)
        self.data = (np.frombuffer(data, np.uint8).copy() if data is not None
                     else self.rng.integers(0, 256, n * BLOCK, dtype=np.uint8))
        self.n = len(self.data) // BLOCK
        self.parity = np.zeros(self.n * PARITY_BLOCK, np.uint8)
        self.sums = np.zeros(self.n * CHECKSUM_BYTES, np.uint8)
        cpu.encode(self.data, self.parity, self.sums)
        self.good = self.snapshot()

    def args(self):
        return self.data, self.parity, self.sums

    def snapshot(self):
        return tuple(a.copy() for a in self.args())

    def same_as(self, snap, blocks=None) -> bool:
        """Bytes equal to snap (only in the given blocks, if any)."""
        sizes = (BLOCK, PARITY_BLOCK, CHECKSUM_BYTES)
        for a, b, size in zip(self.args(), snap, sizes, strict=True):
            a, b = a.reshape(self.n, size), b.reshape(self.n, size)
            if blocks is not None:
                a, b = a[blocks], b[blocks]
            if not np.array_equal(a, b):
                return False
        return True

    def where(self, b: int, c: int, k: int):
        """The array and index holding symbol k of codeword c of block b."""
        if k < MESSAGE:
            return self.data, b * BLOCK + k * CODEWORDS + c
        return self.parity, b * PARITY_BLOCK + (k - MESSAGE) * CODEWORDS + c

    def codeword(self, b: int, c: int) -> bytes:
        return bytes(int(a[i]) for a, i in (self.where(b, c, k) for k in range(LENGTH)))

    def hit(self, b: int, c: int, positions) -> int:
        """Flip each position of a codeword to a different random value; returns the count."""
        for k in positions:
            a, i = self.where(b, c, int(k))
            a[i] ^= self.rng.integers(1, 256)
        return len(positions)


ECC_MD_VECTORS = [
    # data, parity sha256, parity[0:32], checksum (docs/ecc.md)
    (hashlib.shake_256(b"gpumemctl-ecc-v1").digest(131072),
     "e8aeeca4805bbd57e6c4075ab0db5af8e6cf7407c924fb9670bfa851b34e822e",
     "7feee2cf4a93681ececb38abbfbcf1a709f94dc406ab4f708d1378e1ae80aead",
     "7478b7743e146fc9"),
    (bytes(131072),
     "9f1dcbc35c350d6027f98be0f5c8b43b42ca52b7604459c0c42be3aa88913d47",
     "00" * 32,
     "0000000000000000"),
    (bytes(i % 251 for i in range(131072)),
     "dc0111bb09ab6ecdaeeade028b2427218fb9728c56317ad1ccdb6416b873b87c",
     "7a3e7668180df8d9cdf02e9c2850719e3f4f63731b5d714b5a6d1e5903253d76",
     "050ad866b319778d"),
]


def reference_checksum(block: bytes) -> bytes:
    """docs/ecc.md's definition, word by word in plain Python."""
    words = struct.unpack(f"<{BLOCK // 4}I", block)
    s1 = sum(words) % 2**32
    s2 = sum((2 * i + 1) * w for i, w in enumerate(words)) % 2**32
    return struct.pack("<II", s1, s2)

# ---------------------------------------------------------------- encoding


@pytest.mark.parametrize("data,parity_sha,parity_head,sum_hex", ECC_MD_VECTORS)
def test_ecc_md_vectors(data, parity_sha, parity_head, sum_hex):
    blk = Blocks(1, data=data)
    assert hashlib.sha256(blk.parity).hexdigest() == parity_sha
    assert blk.parity[:32].tobytes().hex() == parity_head
    assert blk.sums.tobytes().hex() == sum_hex
    assert cpu.checksum(data).tobytes().hex() == sum_hex
    assert reference_checksum(data).hex() == sum_hex


def test_single_codeword_vector():
    # Codeword 5 carries bytes(range(128)); every other codeword is zero (parity zero).
    data = np.zeros(BLOCK, np.uint8)
    data[np.arange(MESSAGE) * CODEWORDS + 5] = np.arange(MESSAGE)
    parity, sums = np.empty(PARITY_BLOCK, np.uint8), np.empty(CHECKSUM_BYTES, np.uint8)
    cpu.encode(data, parity, sums)
    columns = parity.reshape(NSYM, CODEWORDS)
    assert columns[:, 5].tobytes().hex() == "e35c80cbff5cb41f"
    assert not np.delete(columns, 5, axis=1).any()


def test_parity_matches_reedsolo(rs):
    blk = Blocks(2, seed=7)
    for b in range(blk.n):
        for c in range(CODEWORDS):
            word = blk.codeword(b, c)
            assert bytes(rs.encode(word[:MESSAGE])) == word, (b, c)


def test_checksum_matches_definition_and_sees_every_word():
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 3 * BLOCK, dtype=np.uint8)
    sums = cpu.checksum(data).reshape(3, CHECKSUM_BYTES)
    for b in range(3):
        assert sums[b].tobytes() == reference_checksum(data[b * BLOCK:(b + 1) * BLOCK].tobytes())
    # Changing any one word changes both halves (odd weights are invertible mod 2^32).
    words = data.view("<u4")
    for i in rng.integers(0, len(words), 50):
        before = cpu.checksum(data).reshape(3, 2, 4)
        words[i] = (int(words[i]) + int(rng.integers(1, 2**32))) % 2**32
        after = cpu.checksum(data).reshape(3, 2, 4)
        changed = (before != after).any(axis=2)
        assert changed[i * 4 // BLOCK].all() and changed.sum() == 2

# ---------------------------------------------------------------- verify


def test_verify_flags_each_kind_of_damage_in_its_block():
    blk = Blocks(5, seed=1)
    assert list(cpu.verify(*blk.args())) == [CLEAN] * 5
    blk.data[1 * BLOCK + 77] ^= 1                   # data
    blk.parity[3 * PARITY_BLOCK + 8191] ^= 0x80     # parity
    blk.sums[4 * CHECKSUM_BYTES + 7] ^= 4           # checksum
    assert list(cpu.verify(*blk.args())) == [CLEAN, cpu.DAMAGED, CLEAN, cpu.DAMAGED, cpu.DAMAGED]

# ---------------------------------------------------------------- repair: correctable damage


@pytest.mark.parametrize("seed", range(40))
def test_up_to_4_errors_per_codeword_are_corrected(seed):
    # More blocks than one batch, so damage lands in several batches.
    blk = Blocks(cpu.BATCH + 3, seed=seed)
    rng = blk.rng
    damaged = rng.choice(blk.n, size=6, replace=False)
    expected = np.zeros(blk.n, np.int64)
    for b in damaged:
        for c in rng.choice(CODEWORDS, size=rng.integers(1, 300), replace=False):
            count = rng.integers(1, 5)
            expected[b] += blk.hit(b, c, rng.choice(LENGTH, size=count, replace=False))
    assert (cpu.verify(*blk.args()) != CLEAN).sum() == len(damaged)
    status, corrected = cpu.repair(*blk.args())
    assert list(status) == [CORRECTED if e else CLEAN for e in expected]
    assert list(corrected) == list(expected)
    assert blk.same_as(blk.good)
    assert list(cpu.verify(*blk.args())) == [CLEAN] * blk.n


def test_corrections_agree_with_reedsolo(rs):
    blk = Blocks(1, seed=11)
    rng = blk.rng
    for c in rng.choice(CODEWORDS, size=40, replace=False):
        blk.hit(0, c, rng.choice(LENGTH, size=rng.integers(1, 5), replace=False))
        message, full, _ = rs.decode(blk.codeword(0, c))
        assert bytes(message) == bytes(blk.good[0][np.arange(MESSAGE) * CODEWORDS + c])
        assert bytes(full[MESSAGE:]) == bytes(blk.good[1].reshape(NSYM, CODEWORDS)[:, c])
    cpu.repair(*blk.args())
    assert blk.same_as(blk.good)


def _burst(blk: Blocks, array: np.ndarray, start: int) -> int:
    """Overwrite 4096 bytes with random ones; returns how many actually changed."""
    before = array[start:start + 4096].copy()
    array[start:start + 4096] = blk.rng.integers(0, 256, 4096, dtype=np.uint8)
    return int((array[start:start + 4096] != before).sum())


@pytest.mark.parametrize("seed", range(20))
def test_4096_byte_bursts_are_corrected(seed):
    blk = Blocks(4, seed=100 + seed)
    rng = blk.rng
    offsets = [0, BLOCK - 4096, int(rng.integers(0, BLOCK - 4096))]    # aligned and not
    expected = [_burst(blk, blk.data, b * BLOCK + o) for b, o in enumerate(offsets)]
    poffset = int(rng.integers(0, PARITY_BLOCK - 4096))
    expected.append(_burst(blk, blk.parity, 3 * PARITY_BLOCK + poffset))
    status, corrected = cpu.repair(*blk.args())
    assert list(status) == [CORRECTED] * 4
    assert list(corrected) == expected
    assert blk.same_as(blk.good)


def test_burst_across_a_block_boundary_is_corrected():
    blk = Blocks(2, seed=5)
    changed = _burst(blk, blk.data, BLOCK - 1500)     # 1500 bytes in block 0, 2596 in block 1
    status, corrected = cpu.repair(*blk.args())
    assert list(status) == [CORRECTED] * 2 and corrected.sum() == changed
    assert blk.same_as(blk.good)

# ---------------------------------------------------------------- repair: too much damage


@pytest.mark.parametrize("seed", range(60))
def test_5_to_8_errors_leave_the_block_untouched(seed):
    # Each even block gets one codeword with 5..8 errors (plus a few correctable ones); odd
    # blocks only correctable damage. The decoder fails or miscorrects on the heavy codeword;
    # either way that block must be UNCORRECTABLE and keep its damaged bytes exactly.
    blk = Blocks(32, seed=1000 + seed)
    rng = blk.rng
    for b in range(blk.n):
        cws = rng.choice(CODEWORDS, size=4, replace=False)
        if b % 2 == 0:
            blk.hit(b, cws[0], rng.choice(LENGTH, size=rng.integers(5, 9), replace=False))
        for c in cws[1:]:
            blk.hit(b, c, rng.choice(LENGTH, size=rng.integers(1, 5), replace=False))
    damaged = blk.snapshot()
    status, corrected = cpu.repair(*blk.args())
    heavy, light = np.arange(0, blk.n, 2), np.arange(1, blk.n, 2)
    assert (status[heavy] == UNCORRECTABLE).all() and not corrected[heavy].any()
    assert blk.same_as(damaged, heavy)
    assert (status[light] == CORRECTED).all()
    assert blk.same_as(blk.good, light)


@pytest.mark.parametrize("parity_errors", [(0, 1, 2, 3, 4), (2, 3, 5, 6, 7)])
def test_miscorrection_is_caught_by_the_checksum(parity_errors):
    # The codeword of message e_127 is g(x) itself, weight 9 at positions 127..135. Adding 5
    # of those coefficients as errors puts the received word at distance 4 from the wrong
    # codeword (original + g), so the decoder confidently "corrects" the other 4, one of them
    # the data byte m_127. Only the checksum tells.
    unit = np.zeros(BLOCK, np.uint8)
    unit[(MESSAGE - 1) * CODEWORDS] = 1
    g_parity = np.zeros(PARITY_BLOCK, np.uint8)
    cpu.encode(unit, g_parity, np.zeros(CHECKSUM_BYTES, np.uint8))
    g = g_parity.reshape(NSYM, CODEWORDS)[:, 0]
    assert g.all()

    blk = Blocks(1, seed=9)
    c = 321
    for i in parity_errors:
        blk.parity[i * CODEWORDS + c] ^= g[i]
    ok, err = cpu._decode(cpu._syndromes(_parity_delta(blk, c)[None]))
    assert ok[0] and np.count_nonzero(err[0]) == 4 and err[0][MESSAGE - 1] == 1
    damaged = blk.snapshot()
    status, corrected = cpu.repair(*blk.args())
    assert status[0] == UNCORRECTABLE and corrected[0] == 0
    assert blk.same_as(damaged)


def _parity_delta(blk: Blocks, c: int) -> np.ndarray:
    fresh = np.zeros(PARITY_BLOCK, np.uint8)
    cpu.encode(blk.data[:BLOCK], fresh, np.zeros(CHECKSUM_BYTES, np.uint8))
    return (fresh ^ blk.parity[:PARITY_BLOCK]).reshape(NSYM, CODEWORDS)[:, c]

# ---------------------------------------------------------------- parity and checksum damage


def test_parity_only_damage_is_repaired():
    blk = Blocks(3, seed=21)
    _burst(blk, blk.parity, 1 * PARITY_BLOCK + 1234)
    status, _ = cpu.repair(*blk.args())
    assert list(status) == [CLEAN, CORRECTED, CLEAN] and blk.same_as(blk.good)


def test_checksum_only_damage():
    blk = Blocks(3, seed=23)
    blk.sums[CHECKSUM_BYTES + 2] ^= 0x10
    assert list(cpu.verify(*blk.args())) == [CLEAN, cpu.DAMAGED, CLEAN]
    # repair sees data and parity agree, so the checksum is the damaged part.
    status, corrected = cpu.repair(*blk.args())
    assert list(status) == [CLEAN, CORRECTED, CLEAN] and not corrected.any()
    assert blk.same_as(blk.good)

# ---------------------------------------------------------------- memory and arguments


def test_repairs_land_in_the_callers_mmap(tmp_path):
    blk = Blocks(2, seed=31)
    path = tmp_path / "alloc"
    path.write_bytes(blk.data.tobytes())
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        data = np.frombuffer(m, np.uint8)
        data[BLOCK + 10:BLOCK + 4106] ^= 0x33
        status, _ = cpu.repair(data, blk.parity, blk.sums)
        assert list(status) == [CLEAN, CORRECTED]
        del data
        m.flush()
    assert path.read_bytes() == blk.good[0].tobytes()


def test_bad_arguments():
    blk = Blocks(2, seed=32)
    with pytest.raises(ValueError):
        cpu.verify(blk.data[:BLOCK + 1], blk.parity, blk.sums)
    with pytest.raises(ValueError):
        cpu.encode(blk.data, blk.parity[:PARITY_BLOCK], blk.sums)
    with pytest.raises(ValueError):
        cpu.repair(blk.data, blk.parity, blk.sums[:8])
    with pytest.raises(TypeError):      # a strided view would be repaired in a copy
        cpu.repair(blk.data[::2], blk.parity[:PARITY_BLOCK], blk.sums[:CHECKSUM_BYTES])
    assert list(cpu.verify(blk.data.tobytes(), blk.parity.tobytes(), blk.sums.tobytes())) == [0, 0]
