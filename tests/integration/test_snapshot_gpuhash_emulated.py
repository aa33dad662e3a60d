"""The GPU block-hash kernel (gpumemctl/snapshots/xxh3.cu) against the xxhash package, on a
machine without a GPU: the kernel's own source under a warp emulation (xxh3_emu.py), so a
snapshot made by either path verifies on the other. The same comparison on a real GPU:
tests/gpu/test_snapshot_gpuhash.py."""
from __future__ import annotations

import ctypes
import os

import pytest

from gpumemctl.snapshots.gpuhash import digests
from tests.integration import xxh3_emu

xxhash = pytest.importorskip("xxhash")
MiB = 1 << 20


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    lib = xxh3_emu.build(str(tmp_path_factory.mktemp("xxh3emu")))
    if lib is None:
        pytest.skip("no C++20 compiler to build the kernel's emulation")
    return xxh3_emu.Emulated(lib)


def _hash(kernel, data: bytes, block: int = MiB, misalign: int = 0) -> list[str]:
    buf = ctypes.create_string_buffer(len(data) + 64)
    base = (ctypes.addressof(buf) + 63) // 64 * 64 + misalign    # 64-byte aligned, as VMM
    ctypes.memmove(base, data, len(data))
    return digests(kernel.words(base, len(data), block))


def _want(data: bytes, block: int = MiB) -> list[str]:
    return [xxhash.xxh3_128_hexdigest(data[i:i + block]) for i in range(0, len(data), block)]


EDGES = [1, 2, 3, 4, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97, 127, 128, 129, 159,
         160, 161, 192, 239, 240, 241, 255, 256, 257, 1000, 1023, 1024, 1025, 1087, 1088,
         1089, 2047, 2048, 2049, 4096 + 3, 15 * 1024 + 63, 16 * 1024 + 1, MiB - 1]


@pytest.mark.parametrize("n", EDGES)
def test_one_block_of_every_edge_size_matches_xxhash(kernel, n):
    data = os.urandom(n)
    assert _hash(kernel, data) == _want(data)


def test_every_size_up_to_1100_bytes_matches_xxhash(kernel):
    for n in range(1, 1100):
        data = os.urandom(n)
        assert _hash(kernel, data) == _want(data), n


def test_blocks_of_a_span_with_a_short_last_block_match_xxhash(kernel):
    data = os.urandom(3 * MiB + 4097)
    assert _hash(kernel, data) == _want(data)
    zeros = bytes(2 * MiB + 100)
    assert _hash(kernel, zeros) == _want(zeros)


def test_a_span_of_small_blocks_and_an_8_byte_aligned_one(kernel):
    data = os.urandom(7 * 2048 + 241)
    assert _hash(kernel, data, block=2048) == _want(data, 2048)
    assert _hash(kernel, data, block=2048, misalign=8) == _want(data, 2048)
