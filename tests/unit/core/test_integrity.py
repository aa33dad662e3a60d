"""Integrity (daemon/core/integrity.py) built on its own over a registry, a journal and the
host backend: parity kept fresh by the jobs that follow writes, verify and repair of bytes
corrupted in the backend's memory, the damage record, and the crash marks in the registry."""
from __future__ import annotations

import os

import pytest

from daemon.core.integrity import Integrity
from daemon.core.namespace import SEALED, UNSEALED, WRITING
from daemon.ecc.layout import BLOCK
from gpumemctl.protocol import Uncorrectable
from gpumemctl.protocol.defaults import SNAPSHOT_BLOCK
from tests.sizes import MiB

from .parts import ROOT, allocation, events, failing, row


@pytest.fixture
def integrity(registry, journal, backend):
    """The layer under test, built by its constructor (conftest.py's is the same)."""
    return Integrity(registry, journal, backend)


def damage_rows(registry, node_id: int) -> set[int]:
    return {r[0] for r in registry.db.execute("SELECT block FROM damage WHERE node = ?",
                                              (node_id,))}


def run(steps):
    """Drive a verify to its end, as the verbs' runner does between its pieces."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


@pytest.fixture
def protected(ns, backend, integrity):
    """A 2 MiB durable allocation with ECC, written through the daemon and synced: its
    parity covers its bytes. And those bytes."""
    a = allocation(ns, ns.root, "a", backend=backend, size=2 * MiB, ecc="rs", durable=True)
    integrity.protect_new(a)
    data = os.urandom(a.size)
    integrity.writes_begin(a)
    backend.write(a.buffer, 0, data)
    integrity.note_written(a, 0, a.size)
    integrity.finish(integrity.job_written(a))
    return a, data


def test_a_write_marks_a_durable_allocation_until_its_sync(registry, protected, integrity):
    a, _ = protected
    assert row(registry, a.id)["unsealed"] == SEALED and not a.writing
    integrity.writes_begin(a)
    assert row(registry, a.id)["unsealed"] == WRITING and a.writing
    integrity.note_written(a, 10, 20)
    assert (a.dirty_from, a.dirty_to) == (10, 20)
    job = integrity.job_written(a)
    assert (job.start, job.end) == (10, 20)
    job.run()                                   # on a worker thread, in the daemon
    integrity.finish(job)
    assert row(registry, a.id)["unsealed"] == SEALED and not a.writing
    assert a.dirty_to <= a.dirty_from
    assert integrity.job_written(a) is None     # nothing left to encode


def test_verify_finds_corrupted_bytes_and_repair_restores_them(registry, backend, protected,
                                                               integrity):
    a, data = protected
    hit = 5 * BLOCK + 7
    backend.write(a.buffer, hit, bytes([data[hit] ^ 0x55]))      # the memory changes alone
    found = run(integrity.verify_steps(a, repair=False))
    assert found["damaged"] == [5] and found["corrected"] == 0 and found["blocks"] == 16
    assert a.state == "degraded" and a.damaged == {5}
    assert row(registry, a.id)["state"] == "degraded" and damage_rows(registry, a.id) == {5}
    assert found["damaged_ranges"] == [[5 * BLOCK, 6 * BLOCK]]
    with pytest.raises(Uncorrectable) as exc:   # found: reads as EIO until repaired
        integrity.require_undamaged(a, hit, hit + 1)
    assert exc.value.details["blocks"] == [5]
    integrity.require_undamaged(a, 0, 5 * BLOCK)
    repaired = run(integrity.verify_steps(a, repair=True))
    assert repaired["corrected"] == 1 and repaired["uncorrectable"] == 0
    assert backend.read(a.buffer, 0, a.size) == data
    assert a.state == "ready" and a.damaged == set()
    assert row(registry, a.id)["state"] == "ready" and damage_rows(registry, a.id) == set()
    assert row(registry, a.id)["verified_ns"] == a.verified_ns is not None
    assert [e["kind"] for e in events(registry) if e["kind"] in ("damage", "healed")] == \
        ["damage", "healed"]


def test_damage_beyond_repair_is_recorded(registry, backend, protected, integrity, caplog):
    a, _ = protected
    backend.write(a.buffer, 2 * BLOCK, os.urandom(BLOCK))
    found = run(integrity.verify_steps(a, repair=True))
    assert found["uncorrectable_blocks"] == [2]
    assert a.state == "degraded" and damage_rows(registry, a.id) == {2}
    for record in caplog.records:
        if "beyond repair" in record.getMessage():
            record.expected = True              # logged at ERROR, on purpose
    # A write that replaces the block whole heals it.
    backend.write(a.buffer, 2 * BLOCK, bytes(BLOCK))
    integrity.note_written(a, 2 * BLOCK, 3 * BLOCK)
    integrity.finish(integrity.job_written(a))
    assert a.state == "ready" and damage_rows(registry, a.id) == set()
    assert run(integrity.verify_steps(a, repair=False))["clean"] == 16


def test_a_failing_registry_leaves_the_damage_record_as_it_was(registry, protected,
                                                              integrity):
    a, _ = protected
    with failing(registry, 2), pytest.raises(Exception, match="state disk"):
        integrity.set_damage(a, {1, 2}, ROOT, reason="test", judged=False)
    assert a.damaged == set() and a.state == "ready"
    assert damage_rows(registry, a.id) == set() and row(registry, a.id)["state"] == "ready"
    integrity.set_damage(a, {1, 2}, ROOT, reason="test", judged=False)
    assert damage_rows(registry, a.id) == {1, 2} and a.state == "degraded"


def test_unwritten_unsynced_and_unsealed_blocks_are_skipped_not_judged(backend, protected,
                                                                       integrity, registry):
    a, _ = protected
    backend.write(a.buffer, 0, b"\0")
    integrity.note_written(a, 0, 1)             # written, not yet synced: parity is stale
    found = run(integrity.verify_steps(a, repair=True))
    assert found["skipped"] == 1 and found["corrected"] == 0 and a.damaged == set()
    integrity.unseal(a)                         # an attached writer
    assert row(registry, a.id)["unsealed"] == UNSEALED
    assert integrity.job_written(a) is None     # its seal encodes everything
    found = run(integrity.verify_steps(a, repair=True))
    assert found["skipped"] == 16 and found["blocks"] == 0
    job = integrity.job_seal(a)
    assert (job.start, job.end) == (0, a.size)
    integrity.encode_sealed(a, job)             # not run by a worker: encoded here
    a.unsealed = False
    assert run(integrity.verify_steps(a, repair=False))["clean"] == 16


def test_no_ecc_or_no_memory_is_not_verified(ns, backend, integrity):
    plain = allocation(ns, ns.root, "plain", backend=backend, size=MiB)
    assert run(integrity.verify_steps(plain, repair=True))["skipped_reason"] == "no ECC"
    assert integrity.protected_bytes(plain) == 0
    pending = allocation(ns, ns.root, "pending", ecc="rs")
    assert run(integrity.verify_steps(pending, repair=True))["skipped_reason"] == "pending"


def test_corrupt_writes_the_memory_and_logs_the_event(registry, backend, protected,
                                                      integrity):
    a, data = protected
    out = integrity.corrupt(a, ROOT, 100, 4, b"\xAA", parity=False)
    assert out == {"path": "a", "offset": 100, "length": 4, "parity": False}
    assert backend.read(a.buffer, 100, 4) == b"\xAA" * 4
    [event] = events(registry, "corrupt")
    assert event["node"] == a.id
    integrity.corrupt(a, ROOT, 0, 1, b"\x01", parity=True)
    assert run(integrity.verify_steps(a, repair=True))["corrected"] == 1   # one block
    assert backend.read(a.buffer, 0, a.size) == data


def test_what_changed_since_a_reset(ns, backend, integrity):
    a = allocation(ns, ns.root, "a", backend=backend, size=2 * MiB)
    first = integrity.take_changes(a, reset=True)
    assert first["blocks"] is None and first["token"] is None   # never reset before
    integrity.note_written(a, SNAPSHOT_BLOCK + 1, SNAPSHOT_BLOCK + 2)
    integrity.note_close_written(a, {"ranges": [[0, 1]]})
    second = integrity.take_changes(a, reset=True)
    assert second["token"] == first["next"] and second["blocks"] == [[0, 2]]
    integrity.note_close_written(a, None)       # a writer that said nothing: anything
    assert integrity.take_changes(a, reset=False)["blocks"] is None


def test_settle_gives_parity_to_what_lacks_it_and_hands_durable_parity_on(ns, backend,
                                                                         integrity):
    durable = allocation(ns, ns.root, "d", backend=backend, size=MiB, ecc="rs", durable=True)
    transient = allocation(ns, ns.root, "t", backend=backend, size=MiB, ecc="rs")
    deposited = []
    rebuilt = integrity.settle([durable, transient], {transient.id: {0}}, deposited.append)
    assert rebuilt == 2 * 8                     # 1 MiB each: 8 blocks
    assert durable.parity is not None and transient.parity is not None
    assert deposited == [durable] and transient.damaged == {0}
