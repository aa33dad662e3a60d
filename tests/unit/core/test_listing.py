"""`ls` by pages (daemon/core/listing.py) over a namespace built on its own: bounded pages
and their cursors, every entry listed once, and what a caller without read or search
permission is shown."""
from __future__ import annotations

import pytest

from daemon.core.listing import list_page
from gpumemctl.protocol import NotFound, PermissionDenied, UsageError

from .parts import ALICE, BOB, ROOT, allocation, mkdir


@pytest.fixture
def tree(ns):
    """a/ (x, y, sub/ (z)), b, and Alice's closed/ (secret) and unlistable/ (seen)."""
    a = mkdir(ns, ns.root, "a")
    for name in ("y", "x"):
        allocation(ns, a, name)
    allocation(ns, mkdir(ns, a, "sub"), "z")
    allocation(ns, ns.root, "b")
    allocation(ns, mkdir(ns, ns.root, "closed", ALICE, 0o700), "secret", ALICE)
    allocation(ns, mkdir(ns, ns.root, "unlistable", ALICE, 0o711), "seen", ALICE)
    return ns


def pages(ns, path, cred, limit, recursive=True):
    out, after = [], None
    while True:
        page, after = list_page(ns, path, cred, recursive=recursive, after=after,
                                limit=limit)
        assert len(page) <= limit
        out.append([e["path"] for e in page])
        if after is None:
            return out


def listed(ns, path, cred, limit, recursive=True):
    return [p for page in pages(ns, path, cred, limit, recursive) for p in page]


ALL = ["a", "a/sub", "a/sub/z", "a/x", "a/y", "b", "closed", "closed/secret",
       "unlistable", "unlistable/seen"]


def test_pages_list_every_entry_once_in_the_walks_order(tree):
    assert listed(tree, "", ROOT, 3) == ALL
    assert pages(tree, "", ROOT, 3)[0] == ["a", "a/sub", "a/sub/z"]
    assert listed(tree, "", ROOT, 100, recursive=False) == \
        ["a", "b", "closed", "unlistable"]
    assert listed(tree, "a", ROOT, 2) == ["a/sub", "a/sub/z", "a/x", "a/y"]


def test_a_description_per_entry(tree):
    page, _ = list_page(tree, "a", ROOT, recursive=False, after=None, limit=None)
    assert [(e["name"], e["type"]) for e in page] == \
        [("sub", "directory"), ("x", "allocation"), ("y", "allocation")]


def test_a_cursor_whose_entry_went_goes_on_after_it(tree, journal):
    _, after = list_page(tree, "", ROOT, recursive=True, after=None, limit=4)
    assert after == "a/x"
    with journal.change(durable=False):
        tree.forget(tree.lookup("a/x", ROOT))
    rest, _ = list_page(tree, "", ROOT, recursive=True, after=after, limit=100)
    assert [e["path"] for e in rest] == ALL[4:]


def test_without_read_or_search_permission(tree):
    seen = listed(tree, "", BOB, 2)
    assert "closed" in seen and "closed/secret" not in seen      # not entered: no r, no x
    assert "unlistable/seen" not in seen        # searchable, not readable: not listed
    with pytest.raises(PermissionDenied, match="may not list"):
        list_page(tree, "closed", BOB, recursive=False, after=None, limit=None)
    with pytest.raises(PermissionDenied):
        list_page(tree, "closed/secret", BOB, recursive=False, after=None, limit=None)
    # Search without read: a name known is reached, the directory is not listed.
    page, _ = list_page(tree, "unlistable/seen", BOB, recursive=False, after=None,
                        limit=None)
    assert [e["path"] for e in page] == ["unlistable/seen"]
    with pytest.raises(PermissionDenied):
        list_page(tree, "unlistable", BOB, recursive=False, after=None, limit=None)
    assert listed(tree, "", ALICE, 2) == ALL              # the owner sees hers


def test_bad_cursors_and_paths(tree):
    for after in ("elsewhere/x", "a//x", ""):
        with pytest.raises(UsageError, match="argument 'after'"):
            list_page(tree, "a", ROOT, recursive=True, after=after, limit=None)
    with pytest.raises(NotFound):
        list_page(tree, "nothing", ROOT, recursive=True, after=None, limit=None)
