"""gpumemd's file descriptors as a budget (daemon/core/fdbudget.py) on its own: how the
open-file limit is split, and the check a step makes before it takes descriptors."""
from __future__ import annotations

import resource

import pytest

from daemon.core.fdbudget import (
    FDS_KEPT,
    FdBudget,
    fds_for,
    fds_of,
    raise_open_file_limit,
)
from daemon.core.nodes import Allocation
from gpumemctl.protocol import NoMemory


def alloc(uid: int, ecc: bool = True) -> Allocation:
    a = Allocation(id=1, name="a", parent=None, uid=uid, gid=uid, mode=0o600, created_ns=1,
                   modified_ns=1, changed_ns=1)
    a.buffer = object()                        # what the backend holds: one fd each
    a.parity = object() if ecc else None
    return a


def budget(limit: int, allocations: list[Allocation], kept=()) -> FdBudget:
    b = FdBudget(limit, max_connections=10, privileged_extra=0, share_per_uid=50)
    b.watch(lambda: list(allocations), lambda: list(kept), lambda: len(allocations),
            lambda uid: sum(a.uid == uid for a in allocations), lambda uid: uid == 0)
    return b


def test_the_limit_is_split_between_connections_and_allocations():
    b = FdBudget(FDS_KEPT + 1024, max_connections=100, privileged_extra=8, share_per_uid=50)
    assert b.connections == 100
    assert b.allocations == 1024 - (100 + 8) * 2
    assert b.for_users == b.allocations - b.allocations // 8
    assert b.per_uid == b.allocations // 2
    assert "at most 404 per uid" in b.summary()
    tiny = FdBudget(FDS_KEPT + 10, max_connections=100, privileged_extra=0)
    assert tiny.connections == 16 and tiny.allocations == 0   # at least 16 connections


def test_descriptors_of_an_allocation():
    assert fds_for("rs") == 2 and fds_for("none") == 1
    assert fds_of(alloc(1000)) == 2 and fds_of(alloc(1000, ecc=False)) == 1
    pending = alloc(1000, ecc=False)
    pending.buffer = None
    assert fds_of(pending) == 0


def test_a_user_is_bound_by_its_share():
    held: list[Allocation] = []
    b = budget(FDS_KEPT + 100, held)            # 68 for allocations, 60 for users, 34 each
    assert (b.allocations, b.for_users, b.per_uid) == (68, 60, 34)
    held += [alloc(1000) for _ in range(16)]    # 32 descriptors
    b.require(1000, 2)                          # 34: at its share
    held.append(alloc(1000))
    with pytest.raises(NoMemory) as exc:
        b.require(1000, 2)
    assert exc.value.details == {"errno": "EDQUOT", "uid": 1000, "fds": 34,
                                 "requested_fds": 2, "fd_limit": 34}
    b.require(1001, 2)                          # another user has its own share
    b.require(0, 2)                             # and root none


def test_users_together_leave_the_administrators_part():
    held = [alloc(1000 + i % 2) for i in range(30)]     # 60 descriptors, 30 each
    b = budget(FDS_KEPT + 100, held)
    with pytest.raises(NoMemory) as exc:
        b.require(1002, 1)
    assert exc.value.details["errno"] == "ENOSPC" and exc.value.details["fd_limit"] == 60
    b.require(0, 8)                             # root: up to all 68
    b.require(None, 8)                          # the daemon's own doing (a restore)
    with pytest.raises(NoMemory) as exc:
        b.require(0, 9)
    assert exc.value.details["fd_limit"] == 68 and "LimitNOFILE" in str(exc.value)


def test_memory_kept_open_after_removal_counts():
    held = [alloc(1000) for _ in range(10)]
    kept = [alloc(1000) for _ in range(7)]      # 20 + 14 descriptors
    b = budget(FDS_KEPT + 100, held, kept)
    with pytest.raises(NoMemory, match="uid 1000 holds 34"):
        b.require(1000, 1)
    b.require(1000, 0)                          # nothing more: never refused


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        before, after = raise_open_file_limit()
        assert before == soft or soft == resource.RLIM_INFINITY
        now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert now == hard and after >= before
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
