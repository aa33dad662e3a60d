"""Sizes the tests compute with: units, and what an allocation holds in memory."""
from __future__ import annotations

from daemon.ecc.layout import parity_bytes
from gpumemctl.protocol import round_up

MiB = 1 << 20


def with_parity(capacity: int) -> int:
    """Memory an allocation of `capacity` holds with ECC on (the default): the data and its
    parity region, rounded to the 2 MiB granularity (daemon/core/parity.py)."""
    return capacity + round_up(parity_bytes(capacity), 2 * MiB)
