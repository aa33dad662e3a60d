"""Parity regions and the codec (daemon/core/parity.py) on the host backend: a region sized
for the capacity, encode, verify and repair block by block, carried over on a resize."""
from __future__ import annotations

import os

import pytest

from daemon.core.nodes import Allocation
from daemon.core.parity import Parity, block_range, capacity_of, protected_blocks
from daemon.ecc.layout import BLOCK, parity_bytes
from gpumemctl.protocol import InternalError
from tests.sizes import MiB, with_parity


def allocation(backend, size: int = 2 * MiB, capacity: int = 2 * MiB) -> Allocation:
    return Allocation(id=1, name="a", parent=None, uid=0, gid=0, mode=0o600, created_ns=1,
                      modified_ns=1, changed_ns=1, size=size, capacity=capacity,
                      device=backend.uuid, state="ready", ecc="rs",
                      buffer=backend.allocate(capacity, backend.uuid, "a"))


@pytest.fixture
def parity(backend):
    return Parity(backend)


@pytest.fixture
def written(backend, parity):
    """A 2 MiB allocation of random bytes with its parity up to date; and the bytes."""
    a = allocation(backend)
    data = os.urandom(a.size)
    backend.write(a.buffer, 0, data)
    assert parity.ensure(a)
    return a, data


def test_a_region_is_sized_for_the_capacity(backend, parity):
    a = allocation(backend)
    assert parity.size_for(a) == with_parity(2 * MiB) - 2 * MiB
    assert Parity.extra("none", backend.device(None), 2 * MiB) == 0
    assert parity.ensure(a, fresh=True)
    assert a.parity.capacity == parity.size_for(a) >= parity_bytes(2 * MiB)
    assert backend.used == with_parity(2 * MiB)
    assert not parity.ensure(a)                 # the right size already: nothing new
    parity.free(a)
    assert a.parity is None and backend.used == 2 * MiB


def test_fresh_zeroed_memory_needs_no_encoding_to_verify_clean(backend, parity):
    a = allocation(backend)
    parity.ensure(a, fresh=True)
    assert parity.check(a, 0, 16, repair=False)["clean"] == 16


def test_verify_finds_a_changed_block_and_repair_restores_its_bytes(backend, parity, written):
    a, data = written
    assert parity.check(a, 0, 16, repair=False) == {
        "blocks": 16, "clean": 16, "corrected": 0, "uncorrectable": [], "symbols": 0,
        "damaged": []}
    hit = 4 * BLOCK + 100
    backend.write(a.buffer, hit, bytes([data[hit] ^ 0xFF, data[hit + 1] ^ 0x0F]))
    found = parity.check(a, 0, 16, repair=False)
    assert found["damaged"] == [4] and found["clean"] == 15 and found["corrected"] == 0
    assert backend.read(a.buffer, hit, 2) != data[hit:hit + 2]     # found, not repaired
    repaired = parity.check(a, 0, 16, repair=True)
    assert (repaired["corrected"], repaired["symbols"], repaired["uncorrectable"]) == (1, 2, [])
    assert backend.read(a.buffer, 0, a.size) == data
    assert parity.check(a, 0, 16, repair=False)["clean"] == 16


def test_a_block_rewritten_whole_is_beyond_repair(backend, parity, written):
    a, _ = written
    backend.write(a.buffer, 7 * BLOCK, os.urandom(BLOCK))
    found = parity.check(a, 0, 16, repair=True)
    assert found["uncorrectable"] == [7] and found["clean"] == 15


def test_encode_covers_the_blocks_a_range_touches(backend, parity, written):
    a, _ = written
    backend.write(a.buffer, 3 * BLOCK - 1, b"\0\0")            # blocks 2 and 3
    assert parity.encode(a, 3 * BLOCK - 1, 3 * BLOCK + 1) == 2
    assert parity.check(a, 0, 16, repair=False)["clean"] == 16
    a.size = 3 * BLOCK + 1                                     # only blocks below the size
    assert parity.encode(a, 0, 2 * MiB) == 4


def test_a_resize_carries_the_parity_of_unchanged_blocks_over(backend, parity, written):
    a, data = written
    # Block 0 changed without its parity: carried over, the old parity still finds it; a
    # region encoded anew would call it clean.
    backend.write(a.buffer, 10, bytes([data[10] ^ 1]))
    backend.resize_in_place(a.buffer, 4 * MiB)
    a.capacity, a.size = 4 * MiB, 3 * MiB
    assert parity.ensure(a, keep_below=2 * MiB)
    found = parity.check(a, 0, 24, repair=False)
    assert found["damaged"] == [0] and found["clean"] == 23
    assert parity.check(a, 0, 24, repair=True)["corrected"] == 1
    assert backend.read(a.buffer, 0, 2 * MiB) == data


def test_blocks_and_ranges():
    a = Allocation(id=1, name="a", parent=None, uid=0, gid=0, mode=0, created_ns=1,
                   modified_ns=1, changed_ns=1, size=BLOCK + 1)
    assert protected_blocks(a) == 2
    assert block_range(BLOCK - 1, BLOCK + 1) == range(0, 2)
    assert block_range(5, 5) == range(0)
    with pytest.raises(InternalError, match="no memory yet"):
        capacity_of(a)                          # pending: no capacity
