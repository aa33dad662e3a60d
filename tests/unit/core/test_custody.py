"""Custody (daemon/core/custody.py) built on its own over the host backend and the in-process
keeper double: memory allocated within the device and the descriptor budget, deposits the
keeper really holds (and gives back when a change rolls back), frees, a durable create's
memory prepared ahead of its row, and a resize's crash-safe order. Start-up's reconciliation
with the keeper is daemon/core/adoption.py's."""
from __future__ import annotations

import os

import pytest

from daemon.core.custody import Custody
from daemon.core.fdbudget import FDS_KEPT, FdBudget
from daemon.core.nodes import Allocation
from gpumemctl.protocol import InternalError, InvalidState, NoMemory
from tests.sizes import MiB, with_parity
from tests.unit.keeper_double import InProcessKeeper, KeptFds

from .parts import ALICE, ROOT, allocation


@pytest.fixture
def custody(registry, journal, backend, keeper, ns, integrity):
    """The layer under test, built by its constructor (conftest.py's is the same)."""
    return Custody(registry, journal, backend, keeper, ns, integrity.parity)


@pytest.fixture
def durable(ns, backend, integrity):
    """Alice's durable 2 MiB allocation with ECC, its first bytes written."""
    a = allocation(ns, ns.root, "a", ALICE, backend=backend, size=2 * MiB, ecc="rs",
                   durable=True)
    integrity.protect_new(a)
    backend.write(a.buffer, 0, b"kept bytes")
    return a


def kept_bytes(kept: KeptFds, key: int, n: int) -> bytes:
    """What the keeper's own copy of the data reads: the same memory, not a copy of it."""
    return os.pread(kept.kept[key][0][0], n, 0)


def test_memory_is_allocated_within_the_device(backend, custody):
    dev = backend.device(None)
    buf = custody.allocate(dev, MiB, 2 * MiB, "rs", "a")
    assert buf.capacity == 2 * MiB and backend.used == 2 * MiB
    backend.free(buf)
    with pytest.raises(NoMemory) as exc:        # its capacity and its parity must fit
        custody.allocate(dev, 62 * MiB, 64 * MiB, "rs", "big")
    assert exc.value.details["needed"] == with_parity(64 * MiB)
    custody.allocate(dev, 62 * MiB, 64 * MiB, "none", "big")   # without parity it fits


def test_a_size_no_device_could_hold_is_final(backend, custody):
    dev = backend.device(None)
    custody.require_could_fit(dev, 60 * MiB, "rs")
    custody.allocate(dev, 40 * MiB, 40 * MiB, "none", "hog")     # full now, but that passes
    custody.require_could_fit(dev, 60 * MiB, "rs")
    with pytest.raises(NoMemory) as exc:
        custody.require_could_fit(dev, 63 * MiB, "rs")
    assert exc.value.details["errno"] == "EFBIG" and "could ever hold it" in str(exc.value)


def test_the_descriptor_budget_is_asked_first(ns, backend, integrity, custody):
    budget = FdBudget(FDS_KEPT + 40, max_connections=10, privileged_extra=0)
    assert (budget.allocations, budget.for_users, budget.per_uid) == (8, 7, 4)
    budget.watch(ns.allocations, list, ns.node_count,
                 lambda uid: ns.nodes.owned.get(uid, 0), lambda uid: uid == 0)
    custody.fds = budget
    for name in ("a", "b"):                     # Alice's: memory and parity, 4 descriptors
        integrity.protect_new(allocation(ns, ns.root, name, ALICE, backend=backend,
                                         size=MiB, ecc="rs"))
    with pytest.raises(NoMemory) as exc:
        custody.require_fds(1000, "rs")
    assert exc.value.details["errno"] == "EDQUOT"
    custody.require_fds(1001, "rs")             # Bob's share is his own: 4 + 2 of 7
    custody.allocate(backend.device(None), MiB, 2 * MiB, "rs", "c")   # the daemon's: of 8
    assert backend.used == 2 * with_parity(2 * MiB) + 2 * MiB        # "c": no parity yet
    integrity.protect_new(allocation(ns, ns.root, "d", ROOT, backend=backend, size=MiB,
                                     ecc="rs"))
    with pytest.raises(NoMemory) as exc:        # 6 held, and 2 more would pass Bob's 7
        custody.require_fds(1001, "rs")
    assert exc.value.details["errno"] == "ENOSPC" and exc.value.details["fd_limit"] == 7
    custody.require_fds(None, "rs")             # the daemon's own doing: 8 of 8


def test_a_deposit_is_held_by_the_keeper_until_withdrawn(registry, journal, kept, custody,
                                                         durable):
    with journal.change(durable=True):
        custody.deposit(durable)
    fds, meta = kept.kept[durable.id]
    assert len(fds) == 2                        # the data and its parity
    assert meta == {"capacity": 2 * MiB, "device": durable.device,
                    "registry": registry.identity.instance}
    assert kept_bytes(kept, durable.id, 10) == b"kept bytes"
    custody.withdraw_quietly(durable.id)
    assert kept.kept == {}
    custody.withdraw_quietly(durable.id)        # nothing there: nothing happens


def test_a_rolled_back_change_takes_its_deposit_back(journal, kept, custody, durable):
    with pytest.raises(RuntimeError), journal.change(durable=True):
        custody.deposit(durable)
        assert durable.id in kept.kept
        raise RuntimeError("a later statement failed")
    assert kept.kept == {}


def test_a_deposit_the_keeper_cannot_take_fails_and_leaks_no_descriptor(
        registry, journal, backend, ns, integrity, durable):
    gone = KeptFds()                            # a keeper that is not running
    custody = Custody(registry, journal, backend, InProcessKeeper(gone), ns,
                      integrity.parity)
    deposit = custody.handover(durable)
    with pytest.raises(InternalError, match="cannot make 'a' durable"):
        custody.send(deposit)
    for fd in deposit.fds:                      # closed, sent or not
        with pytest.raises(OSError):
            os.fstat(fd)
    custody.withdraw_quietly(durable.id)        # an unreachable keeper is reconciled later


def test_send_begin_answers_at_once_from_an_answering_keeper(kept, custody, durable):
    deposit = custody.handover(durable)
    assert deposit.taken_from(durable)
    assert custody.send_begin(deposit) is None
    assert durable.id in kept.kept


def test_free_gives_memory_and_parity_back(backend, custody, durable):
    assert backend.used == with_parity(2 * MiB)
    custody.free(durable)
    assert (durable.buffer, durable.parity, backend.used) == (None, None, 0)
    custody.free(durable)                       # twice: nothing more to give


def test_a_durable_create_prepares_memory_before_its_row(backend, kept, ns, custody):
    ids = ns.ids.reserve(2)
    prepared = custody.prepare(ids, ALICE, 0o600, MiB, backend.device(None), 2 * MiB, "rs",
                               "x/a")
    alloc = prepared.alloc
    assert (alloc.id, prepared.dir_ids, alloc.name) == (ids[1], ids[:1], "x/a")
    assert alloc.parity is not None and backend.used == with_parity(2 * MiB)
    assert ns.node_or_none(alloc.id) is None    # outside the tree until its row
    custody.send(custody.handover(alloc))
    custody.abandon(prepared)                   # not created after all
    assert kept.kept == {} and backend.used == 0


def test_a_pending_allocation_gets_memory_deposit_then_commit(ns, backend, kept, custody):
    a = allocation(ns, ns.root, "p", ALICE, durable=True)
    seen_at_commit = []

    def commit():
        seen_at_commit.append(a.id in kept.kept)
    custody.allocate_pending(a, backend.device(None), MiB, 2 * MiB, commit)
    assert seen_at_commit == [True]             # the keeper held it before the commit
    assert (a.state, a.device, a.buffer.capacity) == ("ready", backend.uuid, 2 * MiB)
    assert backend.read(a.buffer, 0, MiB) == bytes(MiB)


def test_a_pending_allocation_whose_commit_fails_stays_pending(ns, backend, kept, custody):
    a = allocation(ns, ns.root, "p", ALICE, durable=True)

    def commit():
        raise NoMemory("no space left on the state disk")
    with pytest.raises(NoMemory):
        custody.allocate_pending(a, backend.device(None), MiB, 2 * MiB, commit)
    assert (a.state, a.device, a.buffer) == ("pending", None, None)
    assert backend.used == 0 and kept.kept == {}


def test_a_resize_in_place_grows_before_its_commit_and_shrinks_after(
        journal, backend, kept, custody, durable):
    with journal.change(durable=True):
        custody.deposit(durable)
    dev = backend.device(None)
    sizes_at_commit = []

    def commit():
        sizes_at_commit.append(os.fstat(durable.buffer.fd).st_size)
    custody.reallocate(durable, dev, 3 * MiB, 4 * MiB, commit)
    custody.reallocate(durable, dev, MiB, 2 * MiB, commit)
    assert sizes_at_commit == [4 * MiB, 4 * MiB]
    assert durable.buffer.capacity == 2 * MiB
    assert os.fstat(kept.kept[durable.id][0][0]).st_size == 2 * MiB   # the same memfd

    def failing_commit():
        raise NoMemory("full")
    with pytest.raises(NoMemory):
        custody.reallocate(durable, dev, 3 * MiB, 4 * MiB, failing_commit)
    assert durable.buffer.capacity == 2 * MiB and backend.read(durable.buffer, 0, 10) == \
        b"kept bytes"


def test_a_resize_into_new_memory_stages_it_under_the_negative_key(
        journal, backend, kept, custody, durable):
    backend.resizes_in_place = False            # as the cuda backend: a new buffer, copied
    with journal.change(durable=True):
        custody.deposit(durable)
    dev = backend.device(None)
    held_at_commit = []

    def commit():
        held_at_commit.append(sorted(kept.kept))
        durable.capacity = 4 * MiB              # what the caller's commit records
    old = durable.buffer
    custody.reallocate(durable, dev, 3 * MiB, 4 * MiB, commit)
    assert held_at_commit == [[-durable.id, durable.id]]     # old and new, both kept
    assert sorted(kept.kept) == [durable.id] and durable.buffer is not old
    assert kept_bytes(kept, durable.id, 10) == b"kept bytes"
    assert backend.read(durable.buffer, 2 * MiB, 16) == bytes(16)   # the grown part zeroed
    assert old.fd == -1                         # the old memory freed

    def failing_commit():
        raise NoMemory("full")
    now = durable.buffer
    with pytest.raises(NoMemory):
        custody.reallocate(durable, dev, MiB, 2 * MiB, failing_commit)
    assert durable.buffer is now and sorted(kept.kept) == [durable.id]


@pytest.mark.parametrize("state, queued, words", [
    ("restoring", False, "being restored"),
    ("lost", True, "queued for restore"),
    ("lost", False, "is lost"),
    ("pending", False, "no memory yet"),
])
def test_what_has_no_memory_to_serve(state, queued, words):
    a = Allocation(id=1, name="a", parent=None, uid=0, gid=0, mode=0, created_ns=1,
                   modified_ns=1, changed_ns=1, state=state, restore_queued=queued)
    with pytest.raises(InvalidState, match=words):
        Custody.require_memory(a)


def test_staged_memory_is_deposited_under_the_key_given(backend, kept, custody):
    buf = backend.allocate(2 * MiB, backend.uuid, "staged")
    custody.stage(-7, buf, 2 * MiB, backend.uuid)
    assert kept.kept[-7][1]["capacity"] == 2 * MiB and len(kept.kept[-7][0]) == 1
