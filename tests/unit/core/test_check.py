"""`check` (daemon/core/check.py) built on its own over the namespace, custody, the registry
and the keeper double: each invariant between registry, tree, backend and keeper, found when
broken behind the daemon's back, and repaired from the tree when asked."""
from __future__ import annotations

import pytest

from daemon.core.check import Checker
from tests.sizes import MiB

from .parts import ALICE, allocation, mkdir


@pytest.fixture
def checker(ns, custody, registry, keeper):
    def check(repair: bool = False) -> dict:
        return Checker(ns, custody, registry, keeper).run(repair=repair)
    return check


@pytest.fixture
def tree(ns, backend, journal, custody):
    """A directory, a durable allocation the keeper holds, and a transient one."""
    d = mkdir(ns, ns.root, "d")
    kept = allocation(ns, d, "kept", ALICE, backend=backend, size=MiB, durable=True)
    with journal.change(durable=True):
        custody.deposit(kept)
    allocation(ns, d, "plain", backend=backend, size=MiB)
    return d, kept


def problems(report: dict) -> list[tuple[str, str]]:
    return [(p["check"], p["message"]) for p in report["problems"]]


def test_a_consistent_daemon_checks_clean(checker, tree):
    report = checker()
    assert report["clean"] and report["problems"] == [] and not report["repaired"]
    assert {"registry_rows_match_tree", "keeper_holds_durable", "holders_table", "hard_links",
            "user_metadata", "backend_memory", "tree_shape", "registry_integrity"} <= \
        set(report["checks"])


def test_a_row_changed_behind_the_daemons_back_is_found_and_rewritten(registry, checker,
                                                                      tree):
    _, kept = tree
    with registry.transaction(durable=False):
        registry.nodes.update(kept.id, mode=0o777, size=5)
    [(check, message)] = problems(checker())
    assert check == "registry_rows" and "differs in mode, size" in message
    assert checker(repair=True)["problems"][0]["repaired"]
    assert checker()["clean"]
    assert tuple(registry.db.execute("SELECT mode, size FROM nodes WHERE id = ?",
                                     (kept.id,)).fetchone()) == (0o644, MiB)


def test_a_row_that_names_nothing_goes_and_a_missing_one_comes_back(registry, checker,
                                                                    tree):
    d, _ = tree
    with registry.transaction(durable=False):
        stray = registry.nodes.insert(parent=d.id, name="ghost", kind="dir", uid=0, gid=0,
                                      mode=0o755, created_ns=1, modified_ns=1, changed_ns=1)
    assert ("registry_rows", f"registry row {stray} ('ghost') names nothing the daemon "
            "holds") in problems(checker())
    checker(repair=True)
    assert checker()["clean"]


def test_the_keeper_must_hold_exactly_the_durable_allocations(kept, checker, tree):
    _, durable = tree
    kept.drop(durable.id)
    kept.put(99, [], {})
    found = problems(checker())
    assert [c for c, _ in found] == ["keeper", "keeper"]
    assert "not held by the keeper" in found[0][1] and "under id 99" in found[1][1]
    checker(repair=True)
    assert set(kept.kept) == {durable.id} and checker()["clean"]


def test_holders_and_metadata_rows_must_be_the_trees(registry, holders, checker, tree):
    _, durable = tree
    holders.add(durable, holders.open_session(ALICE), "read")
    with registry.transaction(durable=False):
        registry.holders.clear()
        registry.metadata.set(durable.id, b"k", b"v")
    assert sorted(c for c, _ in problems(checker())) == ["holders", "metadata"]
    checker(repair=True)
    assert checker()["clean"]
    assert len(registry.holders.load()) == 1 and registry.metadata.load() == []


def test_memory_must_match_what_the_tree_says(backend, checker, tree):
    _, durable = tree
    backend.resize_in_place(durable.buffer, 4 * MiB)
    [(check, message)] = problems(checker())
    assert check == "backend_memory" and "backend holds 4194304 bytes" in message


def test_a_file_open_on_the_mount_is_no_problem(registry, holders, checker, tree):
    """The mount's open files never get a row (Holders.add): check compares the table with
    the holders that do, and a repair never writes one for a mount file (nothing would
    delete it)."""
    _, durable = tree
    mounted = holders.add(durable, holders.open_session(ALICE), "mount-r")
    reader = holders.add(durable, holders.open_session(ALICE), "read")
    assert checker()["clean"]
    with registry.transaction(durable=False):
        registry.holders.clear()
    [(check, message)] = problems(checker())
    assert check == "holders" and f"the daemon has [{reader.id}]" in message
    checker(repair=True)
    assert [r["id"] for r in registry.holders.load()] == [reader.id]
    assert mounted.id in durable.holders and checker()["clean"]
