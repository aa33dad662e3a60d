"""The host tiers a wake lets go of (daemon/backends/tier.py, Spares): kept for the next
sleep of about their size, released once unused for SPARE_SECONDS, never serving more than
the size they are reused for."""
from __future__ import annotations

import os
import time

from daemon.backends.tier import SPARE_SECONDS, HostTier, Spares

MiB = 1 << 20


def _tier(size: int, fill: bytes = b"") -> HostTier:
    t = HostTier.create(size, "test")
    if fill:
        t.view[:len(fill)] = fill
    return t


def test_a_spare_serves_a_size_it_fits_within_a_quarter():
    spares = Spares()
    spares.give(_tier(4 * MiB))
    assert spares.take(5 * MiB) is None           # too small
    assert spares.take(2 * MiB) is None           # would waste half of it
    t = spares.take(4 * MiB - 100)
    assert t is not None and t.size == 4 * MiB - 100 and len(t.view) == t.size
    assert spares.take(4 * MiB) is None           # taken
    t.close()


def test_the_smallest_fitting_spare_is_taken():
    spares = Spares()
    big, small = _tier(5 * MiB), _tier(4 * MiB)
    spares.give(big)
    spares.give(small)
    assert spares.take(4 * MiB) is small
    assert spares.bytes == 5 * MiB
    spares.close()
    small.close()


def test_a_reused_tier_shows_only_the_new_size():
    old = os.urandom(3 * MiB)
    t = _tier(3 * MiB, old)
    spares = Spares()
    spares.give(t)
    again = spares.take(3 * MiB - 4096)
    assert again is t and bytes(again.view) == old[:3 * MiB - 4096]
    assert again.crc is None
    again.close()


def test_spares_unused_for_their_time_are_released():
    spares = Spares()
    t = _tier(MiB)
    fd = t.fd
    spares.give(t)
    assert spares.sweep() == 0
    assert spares.sweep(time.monotonic() + SPARE_SECONDS) == 1
    assert spares.take(MiB) is None
    _wait_closed(fd)


def _wait_closed(fd: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.fstat(fd)
        except OSError:
            return
        time.sleep(0.01)
    raise AssertionError(f"fd {fd} still open")


def test_without_a_time_nothing_is_kept():
    spares = Spares(seconds=0)
    spares.give(_tier(MiB))
    assert spares.take(MiB) is None and spares.bytes == 0
