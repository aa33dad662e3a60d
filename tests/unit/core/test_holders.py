"""Holders (daemon/core/holders.py) built on their own over a registry and a journal: the
records of who holds an allocation (rows in the registry, but for the mount's files), the
sessions they belong to, one writer or many readers, and each uid's bound."""
from __future__ import annotations

import pytest

from daemon.core import containers
from daemon.core.containers import Origin
from daemon.core.holders import Holders
from daemon.core.nodes import Allocation, Holder
from daemon.core.permissions import Credentials
from daemon.core.sessions import Session
from gpumemctl.protocol import Busy, NoMemory, NotFound

from .parts import ALICE, BOB, ROOT, failing


@pytest.fixture
def holders(registry, journal):
    """The layer under test, built by its constructor (conftest.py's is the same)."""
    return Holders(registry, journal)


def alloc(node_id: int = 2, name: str = "a") -> Allocation:
    return Allocation(id=node_id, name=name, parent=None, uid=1000, gid=1000, mode=0o666,
                      created_ns=1, modified_ns=1, changed_ns=1, size=1, capacity=1,
                      state="ready")


def holder_rows(registry) -> list[tuple]:
    return [tuple(r) for r in registry.db.execute(
        "SELECT id, node, session, kind, uid FROM holders ORDER BY id")]


def test_a_holder_is_a_row_and_a_record_on_the_allocation_and_its_session(registry,
                                                                         holders):
    a = alloc()
    session = holders.open_session(ALICE, "test client")
    assert holders.sessions == {session.id: session}
    h = holders.add(a, session, "read")
    assert a.holders == {h.id: h} and session.holders == {h.id: h}
    assert (h.kind, h.uid, h.pid) == ("read", 1000, ALICE.pid)
    assert holder_rows(registry) == [(h.id, a.id, session.id, "read", 1000)]
    assert holders.per_uid == {1000: 1}
    holders.drop(h)
    assert a.holders == {} and session.holders == {} and holder_rows(registry) == []
    assert holders.per_uid == {}


def test_the_mounts_files_have_no_row_and_no_bound(registry, holders):
    holders.max_per_uid = 0
    a = alloc()
    session = holders.open_session(ROOT)
    h = holders.add(a, session, "mount-w", ALICE)
    assert h.uid == 1000 and a.holders == {h.id: h}
    assert holder_rows(registry) == [] and holders.per_uid == {}
    holders.drop(h)
    assert a.holders == {}


def test_a_failing_registry_keeps_the_holder_as_it_was(registry, holders):
    a = alloc()
    session = holders.open_session(ALICE)
    with failing(registry, 2), pytest.raises(NoMemory):
        holders.add(a, session, "read")
    assert a.holders == {} and session.holders == {} and holders.per_uid == {}
    h = holders.add(a, session, "read")
    with failing(registry, 2), pytest.raises(NoMemory):
        holders.drop(h)
    assert a.holders == {h.id: h} and session.holders == {h.id: h}
    assert holder_rows(registry) == [(h.id, a.id, session.id, "read", 1000)]
    assert holders.per_uid == {1000: 1}


def test_one_writer_or_many_readers(holders):
    a = alloc()
    mine, theirs = Session(cred=ALICE), Session(cred=BOB)

    def hold(kind, session, i):
        a.holders[i] = Holder(id=i, kind=kind, session=session, alloc=a, pid=i, uid=0,
                              since_ns=0)
    holders.require_lockable(a, writable=True)
    hold("read", mine, 1)
    hold("attach-r", theirs, 2)
    hold("lease", theirs, 3)
    hold("mount-w", theirs, 4)                  # leases and mount files never lock
    holders.require_lockable(a, writable=False)
    with pytest.raises(Busy, match="read by pid 1, attach-r by pid 2"):
        holders.require_lockable(a, writable=True)
    with pytest.raises(Busy, match="attach-r by pid 2"):
        holders.require_no_others(a, mine, "resized")
    holders.require_no_other_writer(a, mine)
    hold("attach-w", theirs, 5)
    with pytest.raises(Busy, match="being written"):
        holders.require_no_other_writer(a, mine)
    with pytest.raises(Busy):
        holders.require_lockable(a, writable=False)
    assert "--force" in holders.busy_message(a)


def test_each_user_holds_at_most_max_per_uid(holders):
    holders.max_per_uid = 2
    a = alloc()
    session = holders.open_session(ALICE)
    holders.add(a, session, "read")
    holders.add(a, session, "lease")
    with pytest.raises(Busy) as exc:
        holders.add(a, session, "read")
    assert exc.value.details == {"uid": 1000, "limit": 2}
    holders.add(a, holders.open_session(BOB), "read")      # another user's own
    for _ in range(3):                                      # the administrator: unbound
        holders.add(a, holders.open_session(ROOT), "read")


def test_find_checks_the_session_and_the_kind(holders):
    a = alloc()
    session, other = holders.open_session(ALICE), holders.open_session(BOB)
    h = holders.add(a, session, "read")
    assert holders.find(session, h.id, ("read", "write"), "open handle") is h
    with pytest.raises(NotFound, match="no attachment"):
        holders.find(session, h.id, ("attach-r",), "attachment")
    with pytest.raises(NotFound, match="no open handle"):
        holders.find(other, h.id, ("read",), "open handle")


def test_a_session_ends_with_what_it_held_for_its_caller_to_release(holders):
    a, b = alloc(2, "a"), alloc(3, "b")
    session = holders.open_session(ALICE)
    kept = holders.add(a, session, "read"), holders.add(b, session, "lease")
    b.unlinked = True
    assert holders.unlinked_held() == [b]
    assert holders.end_session(session) == list(kept)
    assert session.closed and session.id not in holders.sessions
    assert holders.unlinked_held() == []        # no session holds it any more
    holders.drop_all(a)
    assert a.holders == {}


ID = "ab" * 32
DOCKER = Origin(f"/system.slice/docker-{ID}.scope", {"runtime": "docker", "id": ID, "pod": None})


def test_a_sessions_cgroup_is_read_once_at_its_opening(holders, monkeypatch):
    """Read at open_session, by the peer's pid (and its pidfd); every holder of the session
    carries it with no read of its own: a pid may be another process's later."""
    reads = []
    monkeypatch.setattr(containers, "read",
                        lambda pid, pidfd=None: reads.append((pid, pidfd)) or DOCKER)
    session = holders.open_session(ALICE, "c", pidfd=99)
    assert session.origin is DOCKER and reads == [(ALICE.pid, 99)]
    a = alloc()
    h = holders.add(a, session, "read")
    assert h.origin is DOCKER and reads == [(ALICE.pid, 99)]
    assert h.to_dict()["container"] == DOCKER.container
    assert h.to_dict()["cgroup"] == DOCKER.cgroup


def test_a_holder_of_another_pid_reads_its_own(holders, monkeypatch):
    """A file open on the mount: the daemon's session, the caller's pid, read then."""
    other = Origin("/user.slice", None)
    monkeypatch.setattr(containers, "read",
                        lambda pid, pidfd=None: DOCKER if pid == 4242 else other)
    session = holders.open_session(ROOT)
    caller = Credentials(pid=4242, uid=1000, gid=1000)
    h = holders.add(alloc(), session, "mount-r", caller)
    assert h.origin is DOCKER and session.origin is other


def test_memory_held_per_container(holders, monkeypatch):
    """Each allocation counted once per container that holds it, whatever its holders
    there; a holder in no container counts in none; `uid` limits it to one user's."""
    pod = Origin("/kubepods/pod1", {"runtime": "cri", "id": "cd" * 32, "pod": "p"})
    origins = iter([DOCKER, DOCKER, pod, Origin("/", None)])
    monkeypatch.setattr(containers, "read", lambda pid, pidfd=None: next(origins))
    s1, s2, s3, s4 = (holders.open_session(c) for c in (ALICE, ALICE, BOB, ALICE))
    a, b = alloc(2, "a"), alloc(3, "b")
    a.capacity, b.capacity = 4096, 8192
    for s, x, kind in ((s1, a, "read"), (s2, a, "read"), (s2, b, "lease"), (s3, a, "read"),
                       (s4, b, "lease")):
        holders.add(x, s, kind)
    assert holders.held_per_container() == [
        {"runtime": "cri", "id": "cd" * 32, "pod": "p", "held_bytes": 4096, "holders": 1},
        {"runtime": "docker", "id": ID, "pod": "", "held_bytes": 4096 + 8192, "holders": 3}]
    assert [c["id"] for c in holders.held_per_container(BOB.uid)] == ["cd" * 32]
    assert holders.held_per_container(4321) == []
