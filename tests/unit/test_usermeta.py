"""User metadata (issue 17) through the verbs, tier (a): the rules for keys and values,
the two bounds and each uid's running total, the permissions, hard links, chown, removal,
a restart, and `check` (the `world` fixture: a real registry, the host backend and the
in-process keeper; `check` runs after each scenario)."""
from __future__ import annotations

import errno
import os

import pytest

from daemon.core.permissions import Credentials
from daemon.fs.errno_map import errno_for
from daemon.verbs.plan import run_sync
from gpumemctl.protocol import Exists, NoMemory, NotFound, PermissionDenied, UsageError
from tests.sizes import MiB

from .world import ROOT, clean

ALICE = Credentials(pid=os.getpid(), uid=1000, gid=1000)
BOB = Credentials(pid=os.getpid(), uid=1001, gid=1001)


def used(m, uid: int) -> int:
    return m.ns.metadata.used(uid)


@pytest.mark.parametrize("key, words", [
    ("", "1 to 250 bytes"),
    ("k" * 251, "251 bytes, at most 250"),
    ("é" * 126, "252 bytes, at most 250"),          # counted in bytes, not characters
    ("a\0b", "NUL"),
    ("gpu.size", "reserved"),
    ("gpu.", "reserved"),
    ("\ud800", "surrogate"),
])
def test_a_bad_key_is_a_usage_error_naming_it_and_the_rule(world, key, words):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB))
    for call in (lambda: m.metadata.meta_set("a", key, "v", ROOT),
                 lambda: m.metadata.meta_get("a", key, ROOT),
                 lambda: m.metadata.meta_rm("a", key, ROOT),
                 lambda: run_sync(m.names.create("b", ROOT, size=MiB, metadata={key: "v"}))):
        with pytest.raises(UsageError) as exc:
            call()
        assert words in str(exc.value) and "metadata key" in str(exc.value)
    assert m.metadata.meta_list("a", ROOT)["metadata"] == {}
    with pytest.raises(NotFound):
        m.queries.lookup("b", ROOT)
    clean(m)


def test_keys_and_values_are_bytes_spelled_as_names_are(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB))
    m.metadata.meta_set("a", "\udcff\udcfe", "\udc80x\\n\udcc3\udca9", ROOT)
    m.metadata.meta_set("a", "k" * 250, "", ROOT)             # the longest key, an empty value
    m.metadata.meta_set("a", "gpu", "not reserved: no dot", ROOT)
    assert m.metadata.meta_get("a", "\udcff\udcfe", ROOT)["value"] == "\udc80x\\né"
    assert m.queries.node(m.queries.lookup("a", ROOT).id).metadata[b"\xff\xfe"] == \
        b"\x80x\\n\xc3\xa9"
    listed = m.metadata.meta_list("a", ROOT)["metadata"]
    assert listed == {"gpu": "not reserved: no dot", "k" * 250: "",
                      "\udcff\udcfe": "\udc80x\\né"}
    assert list(listed) == sorted(listed, key=lambda k: k.encode("utf-8", "surrogateescape"))
    with pytest.raises(UsageError, match="surrogate"):
        m.metadata.meta_set("a", "k", "\ud800", ROOT)
    clean(m)


def test_set_get_rm_create_replace_and_info(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB))
    assert m.queries.info("a", ROOT)["metadata"] == {}
    assert m.metadata.meta_set("a", "k", "one", ROOT) == {"path": "a", "key": "k", "bytes": 3}
    with pytest.raises(Exists) as exc:
        m.metadata.meta_set("a", "k", "two", ROOT, create=True)
    assert "metadata key 'k' exists on 'a'" in str(exc.value)
    assert errno_for(exc.value) == errno.EEXIST
    with pytest.raises(NotFound) as exc:
        m.metadata.meta_set("a", "other", "two", ROOT, replace=True)
    assert errno_for(exc.value) == errno.ENODATA
    with pytest.raises(UsageError, match="exclude each other"):
        m.metadata.meta_set("a", "k", "two", ROOT, create=True, replace=True)
    m.metadata.meta_set("a", "k", "two", ROOT, replace=True)
    m.metadata.meta_set("a", "new", "x", ROOT, create=True)
    assert m.queries.info("a", ROOT)["metadata"] == {"k": "two", "new": "x"}
    # ls does not carry it
    assert [e for e in m.queries.listdir("", ROOT) if "metadata" in e] == []
    assert m.metadata.meta_rm("a", "k", ROOT) == {"path": "a", "key": "k"}
    with pytest.raises(NotFound) as exc:
        m.metadata.meta_get("a", "k", ROOT)
    assert str(exc.value) == "no metadata key 'k' on 'a'"
    with pytest.raises(NotFound, match="no metadata key 'k' on 'a'"):
        m.metadata.meta_rm("a", "k", ROOT)
    kinds = [(e["kind"], e["detail"]) for e in m.registry.event_log.query() if e["kind"] == "meta"]
    assert kinds == [("meta", {"action": "set", "key": "k", "bytes": 3}),
                     ("meta", {"action": "set", "key": "k", "bytes": 3}),
                     ("meta", {"action": "set", "key": "new", "bytes": 1}),
                     ("meta", {"action": "rm", "key": "k"})]
    assert used(m, 0) == len("new") + len("x")  # root's: counted, though no bound binds it
    clean(m)


def test_directories_carry_metadata_links_and_special_files_do_not(world):
    m = world.m
    m.names.mkdir("d", ROOT)
    m.metadata.meta_set("d", "owner", "team-a", ROOT)
    assert m.queries.info("d", ROOT)["metadata"] == {"owner": "team-a"}
    run_sync(m.names.create("d/a", ROOT, size=MiB))
    m.names.symlink("ln", "d/a", ROOT)
    m.metadata.meta_set("ln", "via", "link", ROOT)          # a link is followed, as info does
    assert m.metadata.meta_list("d/a", ROOT)["metadata"] == {"via": "link"}
    fifo = m.names.mknod_child(m.ns.root.id, "fifo", ROOT, 0o644, 0o010000)
    with pytest.raises(UsageError) as exc:
        m.metadata.meta_set("fifo", "k", "v", ROOT)
    assert "metadata is kept on allocations and directories only" in str(exc.value)
    with pytest.raises(UsageError, match="allocations and directories only"):
        m.metadata.meta_list("fifo", ROOT)
    with pytest.raises(UsageError) as exc:
        m.metadata.set_metadata(fifo, b"k", b"v", ROOT, authorised=True)     # the mount's way in
    assert errno_for(exc.value) == errno.EPERM
    m.metadata.meta_set("", "top", "root directory", ROOT)
    assert m.queries.info("", ROOT)["metadata"] == {"top": "root directory"}
    clean(m)


def test_hard_links_share_it_and_the_last_name_takes_it(world):
    m = world.m
    m.names.setattr(m.ns.root.id, ROOT, mode=0o1777)
    run_sync(m.names.create("a", ALICE, size=MiB, durable=True, mode=0o644))
    m.names.link("a", "b", ALICE)
    m.metadata.meta_set("b", "k", "v" * 100, ALICE)
    assert m.metadata.meta_get("a", "k", ALICE)["value"] == "v" * 100
    assert used(m, 1000) == 101
    m.names.remove("a", ALICE)
    assert used(m, 1000) == 101 and m.metadata.meta_list("b", ALICE)["metadata"] == {"k": "v" * 100}
    m.names.remove("b", ALICE)
    assert used(m, 1000) == 0 and m.registry.metadata.load() == []
    clean(m)


def test_the_per_node_bound_counts_keys_and_values(world):
    m = world.m
    m.meta_bounds.max_bytes = 100
    run_sync(m.names.create("a", ROOT, size=MiB))
    m.metadata.meta_set("a", "k", "v" * 99, ROOT)              # 1 + 99: exactly the bound
    with pytest.raises(UsageError) as exc:
        m.metadata.meta_set("a", "x", "", ROOT)
    assert str(exc.value) == ("metadata of 'a' would take 101 bytes (keys and values), more "
                              "than the 100 one allocation or directory may hold "
                              "(metadata_max_bytes)")
    assert errno_for(exc.value) == errno.ENOSPC
    m.metadata.meta_set("a", "k", "v" * 50, ROOT)              # a shrink is always allowed
    m.meta_bounds.max_bytes = 10                      # ... as a lowered bound's is
    m.metadata.meta_set("a", "k", "v" * 20, ROOT)
    with pytest.raises(UsageError, match="'big' would take 22 bytes"):
        run_sync(m.names.create("big", ROOT, size=MiB, metadata={"k": "v" * 21}))
    with pytest.raises(NotFound):
        m.queries.lookup("big", ROOT)                         # checked first: nothing made
    clean(m)


def test_the_per_user_bound_binds_owners_but_not_root(world):
    m = world.m
    m.meta_bounds.user_max_bytes = 1000
    m.names.setattr(m.ns.root.id, ROOT, mode=0o1777)
    run_sync(m.names.create("a", ALICE, size=MiB))
    run_sync(m.names.create("b", ALICE, size=MiB))
    m.metadata.meta_set("a", "k", "v" * 599, ALICE)
    with pytest.raises(NoMemory) as exc:
        m.metadata.meta_set("b", "k", "v" * 400, ALICE)        # 600 + 401 > 1000
    assert str(exc.value) == ("metadata quota exceeded for uid 1000: 1000 bytes (1000B) of "
                              "metadata allowed (metadata_user_max_bytes), 600 used, 401 "
                              "more requested")
    assert exc.value.code == 7 and errno_for(exc.value) == errno.EDQUOT
    m.metadata.meta_set("b", "k", "v" * 399, ALICE)            # exactly the bound
    assert used(m, 1000) == 1000
    with pytest.raises(NoMemory):                     # root acting pays in the owner's name
        m.metadata.meta_set("b", "x", "", ROOT)
    with pytest.raises(NoMemory):
        run_sync(m.names.create("c", ALICE, size=MiB, metadata={"k": "v"}))
    m.metadata.meta_rm("a", "k", ALICE)                        # freed: the bytes may be set again
    assert used(m, 1000) == 400
    m.metadata.meta_set("b", "more", "v" * 500, ALICE)
    run_sync(m.names.create("mine", ROOT, size=MiB, metadata={"k": "v" * 5000}))  # root: no bound
    assert used(m, 1000) == 904 and used(m, 0) == 5001
    clean(m)


def test_chown_moves_the_bytes_to_the_new_owner(world):
    m = world.m
    a = run_sync(m.names.create("a", ROOT, size=MiB, metadata={"k": "v" * 9}))
    assert used(m, 0) == 10
    m.names.setattr(a["id"], ROOT, uid=1000)
    assert used(m, 0) == 0 and used(m, 1000) == 10
    m.names.setattr(a["id"], ROOT, uid=1001, gid=1001)
    assert used(m, 1000) == 0 and used(m, 1001) == 10
    clean(m)


def test_read_to_get_write_to_set_search_on_the_way(world):
    m = world.m
    m.names.setattr(m.ns.root.id, ROOT, mode=0o1777)
    run_sync(m.names.create("shared", ALICE, size=MiB, mode=0o644, metadata={"k": "v"}))
    run_sync(m.names.create("private", ALICE, size=MiB, mode=0o600, metadata={"k": "v"}))
    m.names.mkdir("closed", ALICE, mode=0o700)
    run_sync(m.names.create("closed/x", ALICE, size=MiB, mode=0o666, metadata={"k": "v"}))
    assert m.metadata.meta_get("shared", "k", BOB)["value"] == "v"
    assert m.queries.info("shared", BOB)["metadata"] == {"k": "v"}
    for verb in (lambda: m.metadata.meta_set("shared", "k", "bob", BOB),
                 lambda: m.metadata.meta_rm("shared", "k", BOB),
                 lambda: m.metadata.meta_get("private", "k", BOB),
                 lambda: m.metadata.meta_list("private", BOB),
                 lambda: m.metadata.meta_get("closed/x", "k", BOB)):
        with pytest.raises(PermissionDenied):
            verb()
    assert m.queries.info("private", BOB)["metadata"] is None      # stat-able, not readable
    assert m.metadata.meta_list("shared", ALICE)["metadata"] == {"k": "v"}
    # A sticky directory's metadata: its owner's to write (Linux's rule for user.*).
    m.names.mkdir("tmp", ALICE, mode=0o1777)
    with pytest.raises(PermissionDenied) as exc:
        m.metadata.meta_set("tmp", "k", "v", BOB)
    assert "sticky" in str(exc.value) and errno_for(exc.value) == errno.EPERM
    m.metadata.meta_set("tmp", "k", "v", ALICE)
    with pytest.raises(PermissionDenied):
        m.metadata.meta_set("", "k", "v", ALICE)            # the root (1777) is the daemon's
    clean(m)


def test_durable_metadata_survives_a_crash_transient_goes_with_its_allocation(world):
    m = world.m
    m.names.setattr(m.ns.root.id, ROOT, mode=0o1777)
    run_sync(m.names.create("keep", ALICE, size=MiB, durable=True, metadata={"index": "{}"}))
    m.metadata.meta_set("keep", "\udcff", "\udcfe" * 3, ALICE)
    run_sync(m.names.create("gone", ALICE, size=MiB, metadata={"k": "v" * 50}))
    m.names.mkdir("d", ALICE)
    m.metadata.meta_set("d", "dk", "dv", ALICE)
    m = world.crash()
    assert m.metadata.meta_list("keep", ALICE)["metadata"] == \
        {"index": "{}", "\udcff": "\udcfe" * 3}
    assert m.metadata.meta_list("d", ALICE)["metadata"] == {"dk": "dv"}
    assert used(m, 1000) == 5 + 2 + 1 + 3 + 4      # the transient one's went with it
    clean(m)


def test_a_removed_but_open_file_keeps_its_metadata_and_its_bytes_are_freed(world):
    m = world.m
    run_sync(m.names.create("a", ROOT, size=MiB, metadata={"k": "v"}))
    node = m.queries.lookup("a", ROOT)
    session = m.handles.open_session(ROOT)
    _holder, (fd,), _info = m.handles.open("a", ROOT, session, "r")
    os.close(fd)
    m.names.remove("a", ROOT, force=True)
    assert used(m, 0) == 0 and m.registry.metadata.load() == []
    assert m.metadata.metadata_value(node, b"k", ROOT) == b"v"              # fgetxattr on the mount
    with pytest.raises(NotFound):
        m.metadata.set_metadata(node, b"k", b"w", ROOT, authorised=True)    # fsetxattr: no row left
    run_sync(m.handles.end_session(session))
    clean(m)


def test_check_names_registry_rows_that_differ_and_repairs_them(world):
    m = world.m
    a = run_sync(m.names.create("a", ROOT, size=MiB, durable=True, metadata={"k": "v"}))
    with m.registry.transaction(durable=True):
        m.registry.metadata.set(a["id"], b"k", b"changed behind our back")
        m.registry.metadata.set(a["id"], b"extra", b"x")
    report = m.checks.check()
    assert [p["check"] for p in report["problems"]] == ["metadata"]
    assert "'a'" in report["problems"][0]["message"]
    m.checks.check(repair=True)
    assert sorted(m.registry.metadata.load()) == [(a["id"], b"k", b"v")]
    clean(m)
