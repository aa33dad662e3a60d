"""Refills (daemon/core/refills.py) built on their own over the namespace, custody (host
backend, keeper double), integrity and lifecycle: how a refill from a snapshot ends, finished
(ready, damage recorded, deposited) or abandoned (a made one removed, any other lost)."""
from __future__ import annotations

import itertools
import os

import pytest

from daemon.core.lifecycle import Lifecycle
from daemon.core.refills import Refill, Refills
from daemon.ecc.layout import BLOCK
from gpumemctl.protocol import NoMemory, UsageError
from tests.sizes import MiB

from .parts import ALICE, allocation, events, failing, row


@pytest.fixture
def lifecycle(registry, journal, ns, custody, integrity, holders):
    return Lifecycle(registry, journal, ns, custody, integrity, holders)


@pytest.fixture
def refills(registry, journal, ns, custody, integrity, lifecycle):
    return Refills(registry, journal, ns, custody, integrity, lifecycle)


@pytest.fixture
def begun(registry, journal, ns, backend, integrity, holders, refills):
    """What the refill verb leaves: a `restoring` allocation (its row says lost), written
    through a `write` handle of Alice's session, known to refills by that handle."""
    def begin(created: bool = False, durable: bool = True):
        a = allocation(ns, ns.root, "a", ALICE, backend=backend, size=2 * MiB, ecc="rs")
        integrity.protect_new(a)
        with journal.change(durable=False):
            journal.keep(a, "state")
            a.state = "restoring"
            registry.nodes.update(a.id, state="lost")
        session = holders.open_session(ALICE)
        holder = holders.add(a, session, "write")
        refills.add(holder.id, Refill(a, created=created, durable=durable, unsealed=False))
        data = os.urandom(a.size)
        backend.write(a.buffer, 0, data)        # the client's writes through its fd
        return a, session, holder, data
    return begin


def test_a_finished_refill_is_ready_and_kept(registry, kept, integrity, refills, begun):
    a, session, holder, _ = begun()
    assert refills.of(holder.id).alloc is a and not a.kept
    integrity.finish(integrity.job_all(a))      # the close's parity job
    info = refills.finish(session, holder, damaged=[])
    assert refills.of(holder.id) is None and a.holders == {}
    assert (a.state, a.durable, info["state"]) == ("ready", True, "ready")
    r = row(registry, a.id)
    assert (r["state"], r["durable"]) == ("ready", 1)
    assert a.id in kept.kept and len(kept.kept[a.id][0]) == 2
    assert [e["detail"] for e in events(registry, "restore")] == \
        ['{"action": "done", "damaged_blocks": 0}']
    assert integrity.parity.check(a, 0, 16, repair=False)["clean"] == 16


def test_blocks_the_snapshot_had_damaged_are_recorded(registry, integrity, refills, begun,
                                                      caplog):
    a, session, holder, _ = begun(durable=False)
    integrity.finish(integrity.job_all(a))
    refills.finish(session, holder, damaged=[[BLOCK + 1, 2 * BLOCK + 1]])
    assert a.state == "degraded" and a.damaged == {1, 2}
    assert {r[0] for r in registry.db.execute("SELECT block FROM damage")} == {1, 2}
    assert not a.durable and row(registry, a.id)["state"] == "degraded"
    for record in caplog.records:
        if "beyond repair" in record.getMessage():
            record.expected = True              # logged at ERROR, on purpose


def test_an_abandoned_refill_of_a_lost_allocation_is_lost_again(registry, backend, kept,
                                                                refills, begun):
    a, session, holder, _ = begun()
    refills.abort(session, holder)
    assert a.state == "lost" and a.buffer is None and backend.used == 0
    assert row(registry, a.id)["state"] == "lost" and kept.kept == {}
    assert "did not complete" in events(registry, "lost")[0]["detail"]


def test_an_abandoned_refill_of_a_made_allocation_removes_it(registry, ns, backend,
                                                             refills, begun):
    a, session, holder, _ = begun(created=True)
    refills.abort(session, holder)
    assert "a" not in ns.root.children and row(registry, a.id) is None
    assert a.unlinked and backend.used == 0
    assert '"action": "abandoned"' in events(registry, "restore")[0]["detail"]


@pytest.mark.parametrize("damaged", [[[0, 3 * MiB]], [[5, 5]], [[0]], "0-1", [[-1, 2]]])
def test_damaged_ranges_must_lie_within_the_allocation(refills, begun, damaged):
    _, session, holder, _ = begun()
    with pytest.raises(UsageError, match="damaged"):
        refills.finish(session, holder, damaged=damaged)


def test_a_refused_finish_leaves_the_refill_to_be_abandoned(registry, refills, begun):
    a, session, holder, _ = begun()
    with pytest.raises(UsageError):
        refills.finish(session, holder, damaged=[[0, 3 * MiB]])
    assert refills.of(holder.id) is not None    # still a refill: its end is still to come
    refills.abort(session, holder)
    assert a.state == "lost" and row(registry, a.id)["state"] == "lost"


def _until_it_commits(registry, end, unchanged) -> int:
    """`end()` with its 1st, 2nd, ... registry statement failing (a full state disk), each
    time on what the failure before left, which `unchanged()` checks is what it was; then
    with none failing. Returns the statements it took."""
    for at in itertools.count(1):
        with failing(registry, at) as conn:
            try:
                end()
            except NoMemory:
                assert conn.failed is not None
            else:
                assert conn.failed is None
                return at - 1
        unchanged()
    raise AssertionError("unreachable")


def test_a_finish_that_meets_a_full_state_disk_changes_nothing(registry, backend, kept,
                                                               holders, integrity, refills,
                                                               begun, caplog):
    """The holder, the state, the damage, the durability and the deposit are one change:
    refused at any statement, the refill is as it was (restoring, held, not kept), and
    the next finish completes it."""
    a, session, holder, data = begun(durable=True)
    integrity.finish(integrity.job_all(a))
    buffer, hid = a.buffer, holder.id

    def unchanged():
        assert (a.state, a.damaged, a.buffer) == ("restoring", set(), buffer)
        assert refills.of(hid) is not None and list(a.holders) == [hid]
        assert [r["id"] for r in registry.holders.load()] == [hid]
        assert row(registry, a.id)["state"] == "lost" and kept.kept == {}
        assert registry.db.execute("SELECT COUNT(*) FROM damage").fetchone()[0] == 0
        assert events(registry, "restore") == [] and holders.per_uid == {ALICE.uid: 1}

    taken = _until_it_commits(registry, lambda: refills.finish(
        session, holder, damaged=[[BLOCK + 1, 2 * BLOCK + 1]]), unchanged)
    assert taken >= 5
    assert (a.state, a.damaged, row(registry, a.id)["state"]) == ("degraded", {1, 2},
                                                                   "degraded")
    assert refills.of(hid) is None and a.holders == {} and registry.holders.load() == []
    assert a.id in kept.kept and backend.read(a.buffer, 0, a.size) == data
    for record in caplog.records:
        if "beyond repair" in record.getMessage():
            record.expected = True              # logged at ERROR, on purpose


@pytest.mark.parametrize("created", [False, True], ids=["lost", "made"])
def test_an_abort_that_meets_a_full_state_disk_changes_nothing(registry, ns, backend,
                                                               refills, begun, created):
    """Abandoned at any statement, the refill stays, with its memory, to be abandoned
    again (a second close, or the session's end retried); the memory goes only once the
    allocation is lost, or removed, for good."""
    a, session, holder, _ = begun(created=created)
    buffer, hid = a.buffer, holder.id

    def unchanged():
        assert (a.state, a.buffer, a.unlinked) == ("restoring", buffer, False)
        assert refills.of(hid) is not None and list(a.holders) == [hid]
        assert ns.root.children["a"] is a and row(registry, a.id)["state"] == "lost"
        assert [r["id"] for r in registry.holders.load()] == [hid]

    assert _until_it_commits(registry, lambda: refills.abort(session, holder),
                             unchanged) >= 3
    assert a.buffer is None and backend.used == 0 and refills.of(hid) is None
    if created:
        assert "a" not in ns.root.children and row(registry, a.id) is None
    else:
        assert a.state == "lost" and row(registry, a.id)["state"] == "lost"
