"""What start-up makes of keeper entries the registry does not list (daemon/core/orphans.py),
on real descriptors: an entry's size, and the refusal's words (classify and held have their
table in tests/unit/test_orphans.py)."""
from __future__ import annotations

import os

from daemon.core.orphans import ADOPT_FLAG, FREE_FLAG, OrphansHeld, capacity_of, held
from tests.sizes import MiB


def memfd(size: int) -> int:
    fd = os.memfd_create("orphan", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def test_an_entrys_size_is_the_larger_of_its_meta_and_its_memory():
    fd = memfd(4 * MiB)                         # grown in place past what its meta says
    try:
        assert capacity_of([fd], {"capacity": 2 * MiB}) == 4 * MiB
        assert capacity_of([fd], {"capacity": 8 * MiB}) == 8 * MiB
        assert capacity_of([fd], None) == 4 * MiB
        assert capacity_of([fd], {"capacity": "big"}) == 4 * MiB
        assert held({3: [fd], -3: [fd]}, None, {3, -3}) == (1, 4 * MiB)
    finally:
        os.close(fd)
    assert capacity_of([], {"capacity": MiB}) == MiB
    assert capacity_of([fd], None) == 0         # closed: nothing to tell


def test_the_refusal_says_what_is_held_and_both_ways_out():
    exc = OrphansHeld(2, 3 * MiB, "/var/lib/gpumemd/registry.sqlite", "it is new")
    message = str(exc)
    assert "2 allocations (3" in message and "(it is new)" in message
    assert ADOPT_FLAG in message and FREE_FLAG in message
    assert (exc.count, exc.nbytes, exc.why) == (2, 3 * MiB, "it is new")
    assert "1 allocation (" in str(OrphansHeld(1, MiB, "r", "x"))
