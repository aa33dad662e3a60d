"""Per-user quotas (daemon/core/quotas.py) on their own: whose limit applies, what counts as
used (capacity held now, and what was removed while still held open), and the check."""
from __future__ import annotations

import pytest

from daemon.core.nodes import Allocation
from daemon.core.quotas import QuotaExceeded, Quotas, human
from gpumemctl.protocol import NoMemory
from tests.sizes import MiB


def alloc(backend, uid: int, capacity: int | None, *, memory: bool = True) -> Allocation:
    a = Allocation(id=capacity or 0, name="a", parent=None, uid=uid, gid=uid, mode=0o600,
                   created_ns=1, modified_ns=1, changed_ns=1, size=capacity or 0,
                   capacity=capacity, state="ready" if memory else "lost")
    if memory and capacity:
        a.buffer = backend.allocate(capacity, backend.uuid, "q")
    return a


@pytest.fixture
def held(backend):
    """Alice's 2 + 4 MiB with memory, a lost 8 MiB of hers, and Bob's 2 MiB."""
    return [alloc(backend, 1000, 2 * MiB), alloc(backend, 1000, 4 * MiB),
            alloc(backend, 1000, 8 * MiB, memory=False), alloc(backend, 1001, 2 * MiB)]


def test_whose_limit(held):
    q = Quotas(lambda: held, {1000: 10 * MiB, 0: MiB}, default=6 * MiB,
               exempt=lambda uid: uid == 0)
    assert q.limit_of(1000) == 10 * MiB         # its own entry
    assert q.limit_of(1001) == 6 * MiB          # the default
    assert q.limit_of(0) == MiB                 # an entry binds even root
    assert Quotas(lambda: held, default=6 * MiB, exempt=lambda uid: uid == 0).limit_of(0) \
        is None                                 # the default does not
    assert Quotas(lambda: held).limit_of(1000) is None


def test_used_counts_capacity_with_memory_and_what_is_kept_open(held, backend):
    unlinked = alloc(backend, 1000, 2 * MiB)
    q = Quotas(lambda: held, {1000: 10 * MiB}, kept=lambda: [unlinked])
    assert q.used(1000) == 2 * MiB + 4 * MiB + 2 * MiB      # not the lost one
    assert q.used(1001) == 2 * MiB


def test_check_refuses_past_the_limit_with_the_figures(held):
    q = Quotas(lambda: held, {1000: 10 * MiB})
    q.check(1000, 4 * MiB)                      # 6 + 4: at the limit
    with pytest.raises(QuotaExceeded) as exc:
        q.check(1000, 4 * MiB + 1)
    assert isinstance(exc.value, NoMemory)
    assert exc.value.details == {"errno": "EDQUOT", "uid": 1000, "quota": 10 * MiB,
                                 "used": 6 * MiB, "requested": 4 * MiB + 1}
    assert "10 MiB quota, 6 MiB used" in str(exc.value)
    q.check(1000, 0)                            # taking nothing more always passes
    q.check(1000, -MiB)
    q.check(1001, 100 * MiB)                    # no limit


def test_report_lists_limits_and_the_defaults_users(held):
    q = Quotas(lambda: held, {1002: MiB}, default=6 * MiB, exempt=lambda uid: uid == 0)
    assert q.report() == [{"uid": 1000, "quota": 6 * MiB, "used": 6 * MiB},
                          {"uid": 1001, "quota": 6 * MiB, "used": 2 * MiB},
                          {"uid": 1002, "quota": MiB, "used": 0}]
    assert q.report(1001) == [{"uid": 1001, "quota": 6 * MiB, "used": 2 * MiB}]
    assert Quotas(lambda: held).report() == []


@pytest.mark.parametrize("n, text", [(4096, "4 KiB"), (1536 * MiB, "1.5 GiB"), (100, "100 B"),
                                     (16 << 30, "16 GiB")])
def test_human(n, text):
    assert human(n) == text
