"""Hard links, the namespace's part `ns.hardlinks` (daemon/core/namespace/hardlinks.py), on a
namespace built on its own: a node's further names in the tree and in the registry's `links`
table, link counts, who may link, the unlink of one name and of the last, and every step taken
back when its change fails."""
from __future__ import annotations

import pytest

from daemon.core.namespace import Namespace
from gpumemctl.protocol import Exists, NoMemory, NotFound, PermissionDenied, UsageError

from .parts import ALICE, BOB, ROOT, allocation, failing, mkdir, row


def link(ns, node, parent, name, cred=ROOT):
    with ns.journal.change(durable=False):
        ns.hardlinks.add_name(node, parent, name, cred)


def unlink(ns, parent, name, node) -> bool:
    with ns.journal.change(durable=False):
        return ns.hardlinks.drop_name(parent, name, node)


def links_rows(registry) -> list[tuple]:
    return [tuple(r) for r in registry.db.execute(
        "SELECT parent, name, node FROM links ORDER BY rowid")]


@pytest.fixture
def dirs(ns):
    return mkdir(ns, ns.root, "a", ALICE, 0o777), mkdir(ns, ns.root, "b", ALICE, 0o777)


def test_a_link_is_one_more_name_of_the_same_node(registry, ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f", ALICE)
    link(ns, f, b, "g", ALICE)
    link(ns, f, a, "h", ALICE)
    assert ns.lookup("b/g", ROOT) is f and ns.lookup("a/h", ROOT) is f
    assert f.nlink == 3 and [(d.name, n) for d, n in f.names] == [("a", "f"), ("b", "g"),
                                                                    ("a", "h")]
    assert links_rows(registry) == [(b.id, "g", f.id), (a.id, "h", f.id)]
    assert ns.nodes.owned[1000] == 2 + 3        # two directories, three names


def test_what_link_refuses(ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f", ALICE, mode=0o644)
    shared = allocation(ns, a, "shared", ALICE, mode=0o666)
    with pytest.raises(PermissionDenied) as exc:
        link(ns, a, b, "dir-link")
    assert exc.value.details["errno"] == "EPERM"
    with pytest.raises(Exists):
        link(ns, f, a, "shared")
    with pytest.raises(PermissionDenied, match="may read and write it"):
        link(ns, f, b, "mine", BOB)             # protected_hardlinks
    link(ns, shared, b, "mine", BOB)            # one Bob may read and write
    closed = mkdir(ns, ns.root, "closed", ALICE, 0o755)
    with pytest.raises(PermissionDenied, match="create entries in"):
        link(ns, shared, closed, "x", BOB)
    with pytest.raises(UsageError):
        link(ns, f, ns.root, ".metadata")
    with ns.journal.change(durable=False):
        ns.forget(f)
    with pytest.raises(NotFound, match="was removed"):
        link(ns, f, b, "late")


def test_a_link_counts_against_its_owners_names(ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f", ALICE)
    ns.max_names_per_uid = ns.nodes.owned[1000]
    with pytest.raises(NoMemory) as exc:
        link(ns, f, b, "g", ROOT)               # the owner's, whoever links it
    assert exc.value.details["errno"] == "EDQUOT"


def test_unlinking_one_name_keeps_the_node_and_the_last_forgets_it(registry, ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f", ALICE)
    link(ns, f, b, "g")
    link(ns, f, b, "h")
    assert unlink(ns, b, "g", f) is False
    assert "g" not in b.children and f.nlink == 2
    assert links_rows(registry) == [(b.id, "h", f.id)]
    assert unlink(ns, a, "f", f) is False       # its first name: the next moves into its row
    assert (f.parent, f.name) == (b, "h") and links_rows(registry) == []
    r = row(registry, f.id)
    assert (r["parent"], r["name"]) == (b.id, "h")
    assert ns.nodes.owned[1000] == 3
    assert unlink(ns, b, "h", f) is True        # the last: the caller frees the memory
    assert ns.node_or_none(f.id) is None and row(registry, f.id) is None


def test_links_are_loaded_back_in_their_order(registry, journal, ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f")
    for name in ("z", "y", "x"):
        link(ns, f, b, name)
    again = Namespace(registry, journal)
    again.load()
    loaded = again.lookup("a/f", ROOT)
    assert [n for _, n in loaded.aliases] == ["z", "y", "x"]
    assert again.lookup("b/y", ROOT) is loaded and loaded.nlink == 4


def test_renaming_one_name_of_several(registry, ns, dirs):
    a, b = dirs
    f = allocation(ns, a, "f")
    link(ns, f, b, "g")
    ns.renames.move(b.id, "g", a.id, "moved", ROOT)
    assert [(d.name, n) for d, n in f.names] == [("a", "f"), ("a", "moved")]
    assert links_rows(registry) == [(a.id, "moved", f.id)]
    ns.renames.move(a.id, "moved", a.id, "f", ROOT)    # onto another name of itself
    assert ns.lookup("a/f", ROOT) is f


@pytest.mark.parametrize("step", ["link", "unlink one", "unlink the first"])
def test_a_step_whose_change_fails_is_taken_back(registry, ns, dirs, step):
    a, b = dirs
    f = allocation(ns, a, "f", ALICE)
    for name in ("g", "h"):
        link(ns, f, b, name)
    do = {"link": lambda: link(ns, f, b, "new"),
          "unlink one": lambda: unlink(ns, b, "g", f),
          "unlink the first": lambda: unlink(ns, a, "f", f)}[step]

    def state():
        return ([(d.name, n) for d, n in f.names], sorted(a.children), sorted(b.children),
                dict(ns.nodes.owned), links_rows(registry), row(registry, f.id))
    before = state()
    for fail_at in range(1, 8):
        with failing(registry, fail_at) as conn:
            try:
                do()
            except NoMemory:
                pass
        if conn.failed is None:                 # past its last statement: it succeeded
            assert fail_at > 4, "fewer statements than a change of a name takes"
            break
        assert state() == before, (step, fail_at)
    else:
        raise AssertionError("more statements than expected")
