"""Creation (daemon/core/creation.py) built on its own over the namespace, custody (the host
backend and the keeper double), integrity, holders, quotas and metadata bounds: a new
allocation's checks, then memory, deposit and commit; a failure anywhere leaves nothing."""
from __future__ import annotations

import json

import pytest

from daemon.core import usermeta
from daemon.core.containers import Origin
from daemon.core.creation import Creation, NewAllocation, Request
from daemon.core.nodes import Allocation, Directory
from daemon.core.permissions import administrative_uid
from daemon.core.quotas import QuotaExceeded, Quotas
from gpumemctl.protocol import InternalError, NoMemory, PermissionDenied, UsageError
from tests.sizes import MiB, with_parity

from .parts import ALICE, BOB, ROOT, events, failing, mkdir, row, statements


@pytest.fixture
def creation(journal, ns, backend, custody, integrity, holders):
    quotas = Quotas(ns.allocations, {1000: 4 * MiB}, kept=holders.unlinked_held)
    bounds = usermeta.Bounds(64, 1000, used=ns.metadata.used, exempt=administrative_uid)
    return Creation(journal, ns, backend, custody, integrity, holders, quotas, bounds, "rs")


def create(creation, path, cred=ROOT, **request) -> Allocation:
    req = Request(**{"size": MiB, **request})
    new = creation.check(path, cred, req)
    assert isinstance(new, NewAllocation)
    return creation.make(new, path, cred, req)


def test_a_transient_allocation_is_memory_parity_and_a_row(registry, ns, backend, kept,
                                                           creation):
    a = create(creation, "a", ALICE, size=MiB, mode=0o600)
    assert ns.lookup("a", ALICE) is a
    assert (a.size, a.capacity, a.state, a.ecc, a.durable) == (MiB, 2 * MiB, "ready", "rs",
                                                               False)
    assert backend.used == with_parity(2 * MiB) and a.parity is not None
    assert backend.read(a.buffer, 0, 16) == bytes(16)
    r = row(registry, a.id)
    assert (r["kind"], r["size"], r["capacity"], r["durable"], r["state"], r["uid"],
            r["mode"]) == ("alloc", MiB, 2 * MiB, 0, "ready", 1000, 0o600)
    [event] = events(registry, "create")
    assert event["node"] == a.id and '"capacity": 2097152' in event["detail"]
    assert kept.kept == {}                      # transient: the keeper holds nothing


def test_a_durable_allocation_is_deposited_and_its_parents_made(registry, ns, kept,
                                                                creation):
    a = create(creation, "x/y/a", durable=True, ecc="none")
    assert isinstance(ns.lookup("x/y", ROOT), Directory)
    assert row(registry, ns.lookup("x", ROOT).id)["mode"] == 0o755
    fds, meta = kept.kept[a.id]
    assert len(fds) == 1 and a.parity is None   # no ECC: the data's fd only
    assert meta == {"capacity": 2 * MiB, "device": a.device,
                    "registry": registry.identity.instance}
    assert [e["kind"] for e in events(registry)] == ["mkdir", "mkdir", "create"]


def test_a_durable_allocation_prepared_before_its_row(registry, ns, backend, kept, custody,
                                                      creation):
    """The socket's durable create: memory and id first, the keeper's deposit while the
    loop goes on, then the row under the id the keeper holds."""
    req = Request(MiB, durable=True)
    new = creation.check("p/a", ROOT, req)
    prepared = creation.prepare(new, "p/a", ROOT, req)
    assert ns.node_or_none(prepared.alloc.id) is None       # not in the tree yet
    custody.send(custody.handover(prepared.alloc))
    assert prepared.alloc.id in kept.kept
    a = creation.make(creation.check("p/a", ROOT, req), "p/a", ROOT, req, prepared)
    assert a.id == prepared.alloc.id and a.buffer is prepared.alloc.buffer
    assert ns.lookup("p", ROOT).id == prepared.dir_ids[0] < a.id
    assert row(registry, a.id)["durable"] == 1
    assert len(kept.kept[a.id][0]) == 2 and backend.used == with_parity(2 * MiB)


def test_an_existing_name_is_returned_not_made(ns, creation):
    a = create(creation, "a")
    assert creation.check("a", ROOT, Request(5 * MiB)) is a


@pytest.mark.parametrize("request_, words", [
    (dict(size=0), "invalid size"),
    (dict(size=True), "invalid size"),
    (dict(mode=0o10000), "invalid mode"),
    (dict(ecc="xor"), "invalid ECC mode"),
    (dict(lease=True), "a lease needs a session"),
    (dict(lease=True, durable=True), "durable allocation cannot have a session lease"),
    (dict(metadata={"gpu.x": "1"}), "reserved"),
])
def test_bad_requests_are_usage_errors_and_take_nothing(registry, backend, creation,
                                                        request_, words):
    with pytest.raises(UsageError, match=words):
        creation.check("a", ROOT, Request(**{"size": MiB, **request_}))
    assert backend.used == 0 and events(registry) == []


def test_the_default_ecc_must_be_known(journal, ns, backend, custody, integrity, holders):
    with pytest.raises(ValueError, match="invalid default ecc"):
        Creation(journal, ns, backend, custody, integrity, holders, Quotas(list),
                 usermeta.Bounds(used=lambda u: 0, exempt=lambda u: True), "crc")


def test_limits_are_checked_before_any_memory(ns, backend, creation):
    create(creation, "a", ALICE, size=3 * MiB)          # 4 MiB of Alice's quota
    with pytest.raises(QuotaExceeded):
        creation.check("b", ALICE, Request(MiB))
    with pytest.raises(NoMemory) as exc:               # no device could ever hold it
        creation.check("big", ROOT, Request(128 * MiB))
    assert exc.value.details["errno"] == "EFBIG"
    with pytest.raises(UsageError, match="metadata_max_bytes"):
        creation.check("m", ROOT, Request(MiB, metadata={"k": "v" * 64}))
    closed = mkdir(ns, ns.root, "closed", ALICE, 0o755)
    with pytest.raises(PermissionDenied):
        creation.check("closed/b", BOB, Request(MiB))
    assert closed.children == {}
    assert backend.used == with_parity(4 * MiB)


def test_metadata_comes_in_the_same_change(registry, ns, creation):
    a = create(creation, "a", metadata={"k": "v", "z": ""})
    assert a.metadata == {b"k": b"v", b"z": b""} and ns.metadata.used(0) == 3
    rows = registry.db.execute("SELECT key, value FROM metadata WHERE node = ?",
                               (a.id,)).fetchall()
    assert [(bytes(k), bytes(v)) for k, v in rows] == [(b"k", b"v"), (b"z", b"")]


def test_a_leased_allocation_is_held_by_its_session(holders, creation):
    session = holders.open_session(ALICE)
    a = create(creation, "a", ALICE, lease=True, session=session)
    assert a.leased and [h.kind for h in a.holders.values()] == ["lease"]
    assert list(session.holders.values()) == list(a.holders.values())


def test_a_create_names_its_sessions_container(registry, holders, creation):
    """The event of a create names the container of the session that made it."""
    session = holders.open_session(ALICE)
    session.origin = Origin("/docker/" + "e" * 64,
                            {"runtime": "docker", "id": "e" * 64, "pod": None})
    a = create(creation, "a", ALICE, lease=True, session=session)
    [event] = events(registry, "create")
    assert json.loads(event["detail"])["container"] == "e" * 64
    assert a.holders[next(iter(a.holders))].origin is session.origin


@pytest.mark.parametrize("durable", [False, True])
def test_a_failing_registry_leaves_no_memory_row_or_deposit(registry, ns, backend, kept,
                                                            creation, durable):
    count = statements(registry, lambda: create(creation, "probe/p", durable=durable))
    baseline = (backend.used, dict(kept.kept), len(events(registry)))
    assert count >= 3
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            create(creation, "d/a", durable=durable)
        assert "d" not in ns.root.children, fail_at
        assert (backend.used, dict(kept.kept), len(events(registry))) == baseline, fail_at
        assert registry.db.execute("SELECT count(*) FROM nodes").fetchone()[0] == 3
    a = create(creation, "d/a", durable=durable)
    assert (a.id in kept.kept) is durable


def test_a_name_taken_between_check_and_make_fails_and_frees_its_memory(ns, backend,
                                                                        creation):
    """make() does not check again (the verbs call it right after check, or check again
    after their slow step): the registry's UNIQUE (parent, name) refuses the row."""
    req = Request(MiB)
    first, second = creation.check("a", ROOT, req), creation.check("a", ROOT, req)
    a = creation.make(first, "a", ROOT, req)
    with pytest.raises(InternalError, match="UNIQUE"):
        creation.make(second, "a", ROOT, req)
    assert ns.lookup("a", ROOT) is a and ns.root.children == {"a": a}
    assert backend.used == with_parity(2 * MiB)
