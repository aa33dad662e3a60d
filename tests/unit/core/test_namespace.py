"""The namespace (daemon/core/namespace/) built on its own over a registry and a journal:
the tree loaded from and kept in step with the registry's rows, lookups and their search
permission, new nodes, renames and exchanges, attributes, user metadata, watchers, reports
and the recovery directory; every change taken back whole when the registry fails. Hard
links, its part `ns.hardlinks`, are tests/unit/core/test_hardlinks.py's."""
from __future__ import annotations

import os
import stat

import pytest

from daemon.core.namespace import NOW, RELATIME_NS, Namespace
from daemon.core.namespace.rules import has_durable, may_search_to, removal_order
from daemon.core.nodes import Allocation, Directory, Special, Symlink
from daemon.core.permissions import DAEMON, Credentials
from daemon.core.quotas import QuotaExceeded, Quotas
from gpumemctl.protocol import (
    Exists,
    InternalError,
    NoMemory,
    NotFound,
    PermissionDenied,
    UsageError,
)
from tests.sizes import MiB

from .parts import ALICE, BOB, ROOT, allocation, events, failing, mkdir, row, statements

ALICE_IN_STAFF = Credentials(pid=1, uid=1000, gid=1000, groups=frozenset({50}))


def no_quota(uid: int, more: int) -> None:
    """setattr's `charge` where no quota applies."""


def snapshot(ns: Namespace) -> dict:
    """The tree as a user sees it, with the counts the namespace keeps."""
    return {"paths": sorted((n.path, n.id, n.mode, n.uid, n.gid, n.modified_ns, n.changed_ns)
                            for n in ns.all_nodes()),
            "entries": {n.id: sorted(n.children) for n in ns.all_nodes()
                        if isinstance(n, Directory)},
            "owned": dict(ns.nodes.owned), "metadata": dict(ns.nodes.metadata)}


def registry_rows(registry) -> list[tuple]:
    return [tuple(r) for r in registry.db.execute("SELECT * FROM nodes ORDER BY id")]


# ---- loading ---------------------------------------------------------------------------------
def test_a_tree_is_loaded_back_as_it_was_made(registry, journal, ns):
    d = mkdir(ns, ns.root, "d", ALICE, 0o750)
    a = allocation(ns, d, "a", ALICE, ecc="rs", durable=True)
    with journal.change(durable=False):
        ns.insert_node(Symlink, d, "ln", ALICE, 0o777, target="a\udcff")
        ns.insert_node(Special, d, "tty", ROOT, 0o600, ftype=stat.S_IFCHR,
                       rdev=os.makedev(4, 1))
        ns.metadata.set(a, b"k", b"v")
    again = Namespace(registry, journal)
    again.load()
    assert snapshot(again) == snapshot(ns)
    loaded = again.lookup("d/a", ROOT)
    assert isinstance(loaded, Allocation) and loaded.id == a.id
    assert (loaded.durable, loaded.ecc, loaded.state, loaded.metadata) == \
        (True, "rs", "pending", {b"k": b"v"})
    assert again.lookup("d/ln", ROOT, follow=False).target == "a\udcff"
    assert again.lookup("d/tty", ROOT).rdev == os.makedev(4, 1)
    assert again.metadata.used(1000) == 2 and again.nodes.owned == {1000: 3, 0: 2}


def test_a_registry_without_its_root_is_refused(registry, journal):
    with registry.transaction(durable=False):
        registry.db.execute("UPDATE nodes SET parent = NULL, kind = 'alloc' WHERE id = 1")
    with pytest.raises(InternalError, match="no root"):
        Namespace(registry, journal).load()


# ---- lookups ---------------------------------------------------------------------------------
def test_lookups_need_search_permission_on_every_directory(ns):
    closed = mkdir(ns, ns.root, "closed", ALICE, 0o700)
    a = allocation(ns, mkdir(ns, closed, "in", ALICE), "a", ALICE)
    assert ns.lookup("closed/in/a", ALICE) is a
    with pytest.raises(PermissionDenied):
        ns.lookup("closed/in/a", BOB)
    with pytest.raises(NotFound, match="'closed/in/b'"):
        ns.lookup("closed/in/b/c", ALICE)
    with pytest.raises(UsageError, match="is a directory, not an allocation"):
        ns.lookup_allocation("closed", ALICE)
    assert ns.lookup("", ROOT, allow_root=True) is ns.root
    assert ns.lookup_child(closed.id, "in", ALICE).name == "in"
    with pytest.raises(PermissionDenied):
        ns.lookup_child(closed.id, "in", BOB)
    with pytest.raises(UsageError) as exc:
        ns.directory(a.id)
    assert exc.value.details["errno"] == "ENOTDIR"
    with pytest.raises(NotFound):
        ns.node(10_000)
    assert ns.node_or_none(a.id) is a and ns.node_or_none(10_000) is None


def test_an_entry_is_looked_up_without_following_it(ns, journal):
    d = mkdir(ns, ns.root, "d")
    allocation(ns, d, "a")
    with journal.change(durable=False):
        link = ns.insert_node(Symlink, d, "ln", ROOT, 0o777, target="a")
    assert ns.lookup_entry("d/ln", ROOT) == (d, "ln", link)
    assert ns.lookup("d/ln", ROOT).name == "a"
    parent, missing = ns.parent_for_new(["d", "x", "y", "z"], ROOT, parents=True)
    assert parent is d and missing == ["x", "y"]
    with pytest.raises(NotFound, match="no such directory"):
        ns.parent_for_new(["d", "x", "y"], ROOT, parents=False)


# ---- new nodes ---------------------------------------------------------------------------------
def test_a_new_node_is_a_row_and_an_entry(registry, ns):
    d = mkdir(ns, ns.root, "d", ALICE, 0o755)
    r = row(registry, d.id)
    assert (r["parent"], r["name"], r["kind"], r["uid"], r["mode"]) == (1, "d", "dir", 1000,
                                                                        0o755)
    assert ns.root.children["d"] is d and ns.nodes.owned[1000] == 1
    assert events(registry, "mkdir") == []      # the caller's to record
    first = ns.ids.reserve(2)
    assert first == [d.id + 1, d.id + 2]
    with ns.journal.change(durable=False):
        chain = ns.insert_dirs(d, ["x", "y"], ALICE, 0o700, ids=first)
    assert chain.path == "d/x/y" and chain.id == first[1]
    assert [e["path"] for e in events(registry, "mkdir")] == ["d/x", "d/x/y"]
    assert ns.parent_for_entry(d.id, "new", ALICE, 0o644) is d
    with pytest.raises(Exists):
        ns.parent_for_entry(d.id, "x", ALICE, 0o644)
    with pytest.raises(PermissionDenied):
        ns.parent_for_entry(d.id, "new", BOB, 0o644)


def test_a_setgid_directory_gives_its_group_and_its_setgid_bit(ns):
    shared = mkdir(ns, ns.root, "shared", Credentials(pid=1, uid=0, gid=50), 0o2777)
    sub = mkdir(ns, shared, "sub", ALICE, 0o755)
    a = allocation(ns, shared, "a", ALICE)
    assert (sub.gid, sub.mode) == (50, 0o2755)
    assert (a.gid, a.mode) == (50, 0o644)
    assert mkdir(ns, ns.root, "plain", ALICE).gid == 1000


def test_reserved_names_and_the_bound_on_a_users_names(ns):
    with pytest.raises(UsageError) as exc:
        mkdir(ns, ns.root, ".metadata")
    assert exc.value.details["errno"] == "EPERM"
    mkdir(ns, mkdir(ns, ns.root, "d"), ".metadata")        # only at the top
    ns.max_names_per_uid = 2
    mkdir(ns, ns.root, "a1", ALICE)
    mkdir(ns, ns.root, "a2", ALICE)
    with pytest.raises(NoMemory) as exc:
        mkdir(ns, ns.root, "a3", ALICE)
    assert exc.value.details == {"errno": "EDQUOT", "uid": 1000, "limit": 2}
    mkdir(ns, ns.root, "r1")
    mkdir(ns, ns.root, "r2")
    mkdir(ns, ns.root, "r3")                    # the administrator: not bound


def test_a_new_node_whose_change_fails_leaves_no_trace(registry, ns):
    d = mkdir(ns, ns.root, "d")
    count = statements(registry, lambda: allocation(ns, d, "probe", ALICE))
    with ns.journal.change(durable=False):
        ns.forget(ns.lookup("d/probe", ROOT))
    before, rows = snapshot(ns), registry_rows(registry)
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            allocation(ns, d, "a", ALICE)
        assert snapshot(ns) == before and registry_rows(registry) == rows, fail_at


def test_a_forgotten_node_leaves_the_tree_and_the_registry(registry, ns):
    d = mkdir(ns, ns.root, "d")
    a = allocation(ns, d, "a", ALICE)
    with ns.journal.change(durable=False):
        ns.metadata.set(a, b"k", b"value")
    before, rows = snapshot(ns), registry_rows(registry)
    with failing(registry, 3), pytest.raises(NoMemory):
        with ns.journal.change(durable=False):
            ns.forget(a)
    assert snapshot(ns) == before and registry_rows(registry) == rows
    with ns.journal.change(durable=False):
        ns.forget(a)
    assert "a" not in d.children and ns.node_or_none(a.id) is None and row(registry, a.id) \
        is None
    assert ns.nodes.owned.get(1000) is None and ns.metadata.used(1000) == 0
    assert registry.metadata.load() == []       # its metadata went with its row


# ---- renames ---------------------------------------------------------------------------------
@pytest.fixture
def two_dirs(ns):
    a, b = mkdir(ns, ns.root, "a"), mkdir(ns, ns.root, "b")
    allocation(ns, a, "x")
    allocation(ns, b, "y")
    return a, b


def test_a_rename_moves_the_row_and_keeps_the_id(registry, ns, two_dirs):
    a, b = two_dirs
    x = ns.lookup("a/x", ROOT)
    node, replaced = ns.renames.move(a.id, "x", b.id, "z", ROOT)
    assert node is x and replaced is None and ns.lookup("b/z", ROOT) is x
    assert (row(registry, x.id)["parent"], row(registry, x.id)["name"]) == (b.id, "z")
    assert [e["detail"] for e in events(registry, "rename")] == \
        ['{"from": "a/x", "to": "b/z"}']
    y = ns.lookup("b/y", ROOT)
    node, replaced = ns.renames.move(b.id, "z", b.id, "y", ROOT)
    assert replaced is y and ns.node_or_none(y.id) is None and row(registry, y.id) is None
    assert b.children == {"y": x}
    with pytest.raises(Exists):
        ns.renames.move(b.id, "y", ns.root.id, "a", ROOT, replace=False)


@pytest.mark.parametrize("src, dst, error, words", [
    ("a", "a/sub", UsageError, "into itself"),
    ("a", "b", Exists, "not empty"),
    ("a/x", "b", UsageError, "cannot replace directory"),
    ("a", "b/y", UsageError, "cannot replace allocation"),
])
def test_what_a_rename_refuses(ns, two_dirs, src, dst, error, words):
    mkdir(ns, ns.lookup("a", ROOT), "sub")
    before = snapshot(ns)
    s, d = src.rsplit("/", 1) if "/" in src else ("", src), \
        dst.rsplit("/", 1) if "/" in dst else ("", dst)
    with pytest.raises(error, match=words):
        ns.renames.move(ns.lookup(s[0], ROOT, allow_root=True).id, s[1],
                        ns.lookup(d[0], ROOT, allow_root=True).id, d[1], ROOT)
    assert snapshot(ns) == before


def test_the_sticky_bit_and_a_directorys_own_permission(ns):
    tmp = mkdir(ns, ns.root, "tmp", ROOT, 0o1777)
    allocation(ns, tmp, "alices", ALICE)
    with pytest.raises(PermissionDenied, match="sticky"):
        ns.renames.move(tmp.id, "alices", tmp.id, "mine", BOB)
    ns.renames.move(tmp.id, "alices", tmp.id, "renamed", ALICE)
    theirs = mkdir(ns, tmp, "theirs", BOB, 0o555)             # no write on itself
    open_dir = mkdir(ns, ns.root, "open", ROOT, 0o777)
    with pytest.raises(PermissionDenied, match="may not move"):
        ns.renames.move(tmp.id, "theirs", open_dir.id, "theirs", BOB)
    assert theirs.parent is tmp


def test_a_rename_whose_change_fails_is_taken_back_whole(registry, ns, two_dirs):
    a, b = two_dirs
    count = statements(registry, lambda: ns.renames.move(a.id, "x", b.id, "y", ROOT))
    ns.renames.move(b.id, "y", a.id, "x", ROOT)
    allocation(ns, b, "y")
    before, rows = snapshot(ns), registry_rows(registry)
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            ns.renames.move(a.id, "x", b.id, "y", ROOT)
        assert snapshot(ns) == before and registry_rows(registry) == rows, fail_at


def test_an_exchange_swaps_two_entries_in_one_change(registry, ns, two_dirs):
    a, b = two_dirs
    x, y = ns.lookup("a/x", ROOT), ns.lookup("b/y", ROOT)
    count = statements(registry, lambda: ns.renames.exchange(a.id, "x", b.id, "y", ROOT))
    assert ns.lookup("a/x", ROOT) is y and ns.lookup("b/y", ROOT) is x
    assert row(registry, x.id)["parent"] == b.id and row(registry, y.id)["parent"] == a.id
    before, rows = snapshot(ns), registry_rows(registry)
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            ns.renames.exchange(a.id, "x", b.id, "y", ROOT)
        assert snapshot(ns) == before and registry_rows(registry) == rows, fail_at
    dir_and_file = ns.renames.exchange(ns.root.id, "a", b.id, "y", ROOT)
    assert dir_and_file[0].path == "b/y" and ns.lookup("a", ROOT) is x


# ---- attributes --------------------------------------------------------------------------------
def test_chmod_chown_and_chgrp_follow_posix(registry, ns):
    a = allocation(ns, ns.root, "a", ALICE, mode=0o6755)
    ns.attributes.setattr(a.id, ALICE, mode=0o6750, charge=no_quota)
    assert a.mode == 0o6750 and row(registry, a.id)["mode"] == 0o6750
    with pytest.raises(PermissionDenied) as exc:
        ns.attributes.setattr(a.id, BOB, mode=0o777, charge=no_quota)
    assert exc.value.details["errno"] == "EPERM"
    with pytest.raises(PermissionDenied, match="only root may change the owner"):
        ns.attributes.setattr(a.id, ALICE, uid=1001, charge=no_quota)
    with pytest.raises(PermissionDenied, match="may not give"):
        ns.attributes.setattr(a.id, ALICE, gid=51, charge=no_quota)
    ns.attributes.setattr(a.id, ALICE_IN_STAFF, gid=50, charge=no_quota)
    assert (a.gid, a.mode) == (50, 0o0750)      # set-id bits cleared by the new owner
    ns.attributes.setattr(a.id, ROOT, uid=1001, charge=no_quota)
    assert ns.nodes.owned == {0: 1, 1001: 1} and row(registry, a.id)["uid"] == 1001
    [*_, last] = events(registry, "setattr")
    assert '"uid": 1001' in last["detail"]


def test_a_new_owner_pays_for_the_memory(ns, backend):
    a = allocation(ns, ns.root, "a", ALICE, backend=backend, size=4 * MiB)
    quotas = Quotas(ns.allocations, {1001: 2 * MiB})
    with pytest.raises(QuotaExceeded):
        ns.attributes.setattr(a.id, ROOT, uid=1001, charge=quotas.check)
    assert a.uid == 1000


def test_times_need_the_owner_or_for_now_write_permission(registry, ns):
    a = allocation(ns, ns.root, "a", ALICE, mode=0o666)
    with pytest.raises(PermissionDenied):
        ns.attributes.setattr(a.id, BOB, mtime_ns=5, charge=no_quota)
    ns.attributes.setattr(a.id, BOB, mtime_ns=NOW, charge=no_quota)     # may write it
    ns.attributes.setattr(a.id, ALICE, mtime_ns=10**18, atime_ns=2 * 10**18,
                          charge=no_quota)
    r = row(registry, a.id)
    assert (a.modified_ns, a.accessed_ns) == (r["modified_ns"], r["accessed_ns"]) == \
        (10**18, 2 * 10**18)
    ns.attributes.setattr(a.id, BOB, mode=0o600, authorised=True, charge=no_quota)
    assert a.mode == 0o600                      # the kernel checked already


def test_a_setattr_whose_change_fails_changes_nothing(registry, ns):
    probe, a = allocation(ns, ns.root, "probe", ALICE), allocation(ns, ns.root, "a", ALICE)
    count = statements(registry, lambda: ns.attributes.setattr(
        probe.id, ROOT, uid=1001, mode=0o600, charge=no_quota))
    before, rows = snapshot(ns), registry_rows(registry)
    for fail_at in range(1, count + 1):
        with failing(registry, fail_at), pytest.raises(NoMemory):
            ns.attributes.setattr(a.id, ROOT, uid=1001, mode=0o600, charge=no_quota)
        assert snapshot(ns) == before and registry_rows(registry) == rows


def test_access_times_move_by_the_relatime_rule(registry, ns):
    a = allocation(ns, ns.root, "a", ALICE)
    ns.attributes.note_access(a)                # not after the modification: moves
    first = a.accessed_ns
    assert first > a.modified_ns and row(registry, a.id)["accessed_ns"] == first
    ns.attributes.note_access(a)                # after it, and recent: stays
    assert a.accessed_ns == first
    a.accessed_ns = first - RELATIME_NS         # a day old: moves again
    ns.attributes.note_access(a)
    assert a.accessed_ns > first


# ---- user metadata ---------------------------------------------------------------------------
def test_metadata_is_kept_on_nodes_rows_and_per_uid_totals(registry, ns):
    a, b = allocation(ns, ns.root, "a", ALICE), allocation(ns, ns.root, "b", ALICE)
    with ns.journal.change(durable=False):
        ns.metadata.set(a, b"k", b"12345")
        ns.metadata.set(b, b"kk", b"")
    assert ns.metadata.used(1000) == 6 + 2 and a.metadata_bytes == 6
    with ns.journal.change(durable=False):
        ns.metadata.set(a, b"k", None)
        ns.metadata.replace(b, {b"x": b"1", b"y": b"2"})
    assert a.metadata == {} and b.metadata == {b"x": b"1", b"y": b"2"}
    assert ns.metadata.used(1000) == 4
    assert sorted((n, bytes(k)) for n, k, _ in registry.metadata.load()) == \
        [(b.id, b"x"), (b.id, b"y")]
    before = (dict(a.metadata), dict(b.metadata), ns.metadata.used(1000))
    with pytest.raises(RuntimeError), ns.journal.change(durable=False):
        ns.metadata.set(a, b"new", b"v")
        ns.metadata.replace(b, {})
        raise RuntimeError
    assert (dict(a.metadata), dict(b.metadata), ns.metadata.used(1000)) == before


# ---- watchers ----------------------------------------------------------------------------------
class Recorder:
    """What the mount does with the namespace's notices: keeps them."""

    def __init__(self):
        self.seen: list[tuple] = []

    def entry_changed(self, parent_id, name):
        self.seen.append(("entry", parent_id, name))

    def attrs_changed(self, node_id):
        self.seen.append(("attrs", node_id))

    def data_changed(self, node_id):
        self.seen.append(("data", node_id))


def test_watchers_hear_of_what_the_kernel_may_cache(ns):
    recorder = Recorder()
    ns.watchers.add(recorder)
    a = allocation(ns, ns.root, "a")
    ns.attributes.setattr(a.id, ROOT, mode=0o600, charge=no_quota)
    ns.watchers.data_changed(a)
    first = ns.watchers.data_generation(a)
    ns.watchers.data_changed(a)
    assert ns.watchers.data_generation(a) == first + 1
    with ns.journal.change(durable=False):
        ns.forget(a)
    assert ns.watchers.data_generation(a) == 0
    # A new entry is no notice (the mount caches no negative entries); a gone one is.
    assert recorder.seen == [("attrs", a.id), ("data", a.id), ("data", a.id),
                             ("entry", 1, "a")]
    ns.watchers.remove(recorder)
    ns.watchers.data_changed(allocation(ns, ns.root, "b"))
    assert len(recorder.seen) == 4


# ---- reports and the recovery directory ----------------------------------------------------------
def test_totals_and_what_a_verify_covers(ns, backend):
    d = mkdir(ns, ns.root, "d", ALICE, 0o700)
    allocation(ns, d, "mine", ALICE, backend=backend, size=MiB, ecc="rs", durable=True)
    other = allocation(ns, ns.root, "other", BOB, backend=backend, size=3 * MiB, mode=0o600)
    allocation(ns, ns.root, "pending")
    totals = ns.reports.totals(sessions=2)
    assert (totals["allocations"], totals["directories"], totals["durable"]) == (3, 1, 1)
    assert (totals["size"], totals["capacity"]) == (4 * MiB, 6 * MiB)
    assert totals["by_state"] == {"ready": 2, "pending": 1} and totals["sessions"] == 2
    assert ns.reports.bytes_held_per_device() == {backend.uuid: 6 * MiB}
    assert [a.path for a in ns.reports.ecc_targets([], ALICE, everything=True)] == \
        ["d/mine", "pending"]                   # not Bob's 0600
    assert ns.reports.ecc_targets(["other"], BOB, everything=False) == [other]
    with pytest.raises(UsageError, match="--all"):
        ns.reports.ecc_targets([], ALICE, everything=False)


def test_the_recovery_directory_is_the_daemons_and_private(ns):
    with ns.journal.change(durable=False):
        first = ns.lost_found.recovery_dir()
    top = first.parent
    assert (top.path, top.uid, top.mode, first.mode) == ("lost+found", DAEMON.uid, 0o700,
                                                         0o700)
    with ns.journal.change(durable=False):
        assert ns.lost_found.recovery_dir().parent is top       # reused
    with ns.journal.change(durable=False):
        ns.attributes.setattr(top.id, ROOT, mode=0o755, charge=no_quota)
        elsewhere = ns.lost_found.recovery_dir()                  # open to others: not
    assert elsewhere.parent.name == "lost+found-2"


# ---- the rules ---------------------------------------------------------------------------------
def test_removal_order_is_children_first_and_checked_before_anything(ns):
    top = mkdir(ns, ns.root, "top", ALICE)
    sub = mkdir(ns, top, "sub", ALICE)
    allocation(ns, sub, "a", ALICE)
    allocation(ns, top, "b", ALICE, durable=True)
    order = removal_order(ns.root, "top", top, ALICE)
    assert [f"{d.path}/{n}".lstrip("/") for d, n, _ in order] == \
        ["top/sub/a", "top/sub", "top/b", "top"]
    ns.attributes.setattr(sub.id, ALICE, mode=0o555, charge=no_quota)
    with pytest.raises(PermissionDenied):
        removal_order(ns.root, "top", top, ALICE)
    assert has_durable(top) and not has_durable(sub) and not has_durable(None)
    assert may_search_to(sub, BOB)
    ns.attributes.setattr(top.id, ALICE, mode=0o700, charge=no_quota)
    assert not may_search_to(sub, BOB) and may_search_to(sub, ALICE)
