"""Lifecycle (daemon/core/lifecycle.py) built on its own over the namespace, custody (host
backend, keeper double), integrity and holders: memory let go after the last name and the
last holder, a leased allocation released with its last holder, durability changed in
crash-safe order."""
from __future__ import annotations

import json

import pytest

from daemon.core.containers import Origin
from daemon.core.lifecycle import Lifecycle
from gpumemctl.protocol import InvalidState, NoMemory, PermissionDenied
from tests.sizes import MiB, with_parity

from .parts import ALICE, BOB, ROOT, allocation, events, failing, row, statements


@pytest.fixture
def lifecycle(registry, journal, ns, custody, integrity, holders):
    return Lifecycle(registry, journal, ns, custody, integrity, holders)


@pytest.fixture
def make(ns, backend, journal, integrity, custody):
    """An allocation with memory and parity; a durable one deposited with the keeper."""
    def make(name="a", cred=ALICE, durable=False, leased=False):
        a = allocation(ns, ns.root, name, cred, backend=backend, size=MiB, ecc="rs",
                       durable=durable)
        integrity.protect_new(a)
        a.leased = leased
        if durable:
            with journal.change(durable=True):
                custody.deposit(a)
        return a
    return make


def test_memory_goes_with_the_last_name(journal, ns, backend, kept, lifecycle, make):
    a = make(durable=True)
    assert a.id in kept.kept and backend.used == with_parity(2 * MiB)
    with journal.change(durable=True):
        ns.forget(a)
    lifecycle.release_memory(a)
    assert a.unlinked and a.buffer is None and a.parity is None
    assert backend.used == 0 and kept.kept == {}


def test_memory_held_open_goes_with_the_last_holder(journal, ns, backend, holders,
                                                   lifecycle, make):
    a = make()
    session = holders.open_session(ALICE)
    reader = holders.add(a, session, "read")
    lease = holders.add(a, session, "lease")
    with journal.change(durable=False):
        ns.forget(a)
    lifecycle.release_memory(a)
    assert a.buffer is not None and backend.used == with_parity(2 * MiB)
    assert holders.unlinked_held() == [a]
    lifecycle.remove_holder(reader)
    assert a.buffer is not None                 # a lease is a holder too
    lifecycle.remove_holder(lease)
    assert a.buffer is None and a.parity is None and backend.used == 0


def test_a_leased_allocation_goes_with_its_last_holder(registry, ns, backend, holders,
                                                      lifecycle, make):
    a = make(leased=True)
    session = holders.open_session(ALICE)
    lease, reader = holders.add(a, session, "lease"), holders.add(a, session, "read")
    lifecycle.remove_holder(lease)
    assert ns.lookup("a", ROOT) is a            # a reader still holds it
    lifecycle.remove_holder(reader)
    assert "a" not in ns.root.children and row(registry, a.id) is None
    assert a.unlinked and backend.used == 0
    [event] = events(registry, "release")
    assert "last holder" in event["detail"]
    assert "container" not in event["detail"]      # its holders ran in no container


def test_a_release_names_the_last_holders_container(registry, holders, lifecycle, make):
    a = make(leased=True)
    session = holders.open_session(ALICE)
    session.origin = Origin("/docker/" + "e" * 64,
                            {"runtime": "docker", "id": "e" * 64, "pod": None})
    lifecycle.remove_holder(holders.add(a, session, "lease"))
    [event] = events(registry, "release")
    assert json.loads(event["detail"])["container"] == "e" * 64


def test_an_allocation_made_durable_is_deposited_then_committed(registry, kept, holders,
                                                               lifecycle, make):
    a = make(leased=True)
    holders.add(a, holders.open_session(ALICE), "lease")
    lifecycle.set_durable(a, ALICE, True)
    assert a.durable and row(registry, a.id)["durable"] == 1
    assert len(kept.kept[a.id][0]) == 2         # data and parity
    assert not a.leased and a.holders == {}     # the durable pin replaces the lease
    lifecycle.set_durable(a, ALICE, True)       # again: nothing to do
    assert [e["kind"] for e in events(registry, "durable")] == ["durable"]
    lifecycle.set_durable(a, ALICE, False)
    assert not a.durable and row(registry, a.id)["durable"] == 0 and kept.kept == {}
    assert a.buffer is not None                 # the memory stays, transient


@pytest.mark.parametrize("durable", [True, False])
def test_a_failing_registry_leaves_durability_as_it_was(registry, kept, lifecycle, make,
                                                        durable):
    probe = make("probe", durable=not durable)
    count = statements(registry, lambda: lifecycle.set_durable(probe, ALICE, durable))
    a = make("a", durable=not durable)
    before = dict((k, len(v[0])) for k, v in kept.kept.items())
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            lifecycle.set_durable(a, ALICE, durable)
        assert a.durable is not durable and row(registry, a.id)["durable"] == (not durable)
        assert dict((k, len(v[0])) for k, v in kept.kept.items()) == before, fail_at
    lifecycle.set_durable(a, ALICE, durable)
    assert (a.id in kept.kept) is durable


def test_who_may_change_durability_and_when(journal, ns, lifecycle, make):
    a = make()
    with pytest.raises(PermissionDenied, match="only the owner"):
        lifecycle.set_durable(a, BOB, True)
    lifecycle.require_durability_change(a, ROOT)
    a.state = "lost"
    with pytest.raises(InvalidState, match="is lost"):
        lifecycle.set_durable(a, ALICE, True)
    a.state = "ready"
    with journal.change(durable=False):
        ns.forget(a)
    lifecycle.release_memory(a)
    with pytest.raises(InvalidState, match="has been removed"):
        lifecycle.set_durable(a, ALICE, True)
