"""Symbolic links for the socket API (daemon/core/links.py) on a tree built by hand: what a
target may be, and how a path is resolved through links (relative and absolute targets,
loops, dangling links, search permission on the way)."""
from __future__ import annotations

import pytest

from daemon.core.links import MAX_HOPS, MAX_TARGET_BYTES, Resolver, check_target
from daemon.core.nodes import Allocation, Directory, Symlink
from gpumemctl.protocol import NotFound, PermissionDenied, UsageError

from .parts import BOB, ROOT

_ids = iter(range(1, 1 << 30))


def new(cls, name, parent, mode=0o755, **fields):
    node = cls(id=next(_ids), name=name, parent=parent, uid=0, gid=0, mode=mode,
               created_ns=1, modified_ns=1, changed_ns=1, **fields)
    if parent is not None:
        parent.add_child(node)
    return node


@pytest.fixture
def tree():
    """/data/a, /data/sub/b, /closed/c (0700), and links between them."""
    root = new(Directory, "", None, 0o1777)
    data = new(Directory, "data", root)
    sub = new(Directory, "sub", data)
    closed = new(Directory, "closed", root, 0o700)
    nodes = {"root": root, "a": new(Allocation, "a", data), "b": new(Allocation, "b", sub),
             "c": new(Allocation, "c", closed), "sub": sub, "data": data}
    new(Symlink, "to-a", sub, target="../a")             # relative, up a level
    new(Symlink, "to-sub", root, target="data/sub")
    new(Symlink, "abs", root, target="/mnt/gpu/data/a")  # under the mount point
    new(Symlink, "host", root, target="/etc/passwd")     # outside the namespace
    new(Symlink, "dangling", root, target="data/nothing")
    new(Symlink, "loop1", root, target="loop2")
    new(Symlink, "loop2", root, target="loop1")
    new(Symlink, "up", root, target="..")
    new(Symlink, "secret", root, target="closed/c")
    return Resolver(lambda: root, mountpoint="/mnt/gpu"), nodes


def resolve(resolver, path, cred=ROOT, follow_last=True):
    return resolver.resolve(path.split("/"), cred, follow_last=follow_last)


def test_links_are_followed_on_the_way_and_at_the_end_when_asked(tree):
    resolver, n = tree
    assert resolve(resolver, "data/sub/to-a") == (n["a"], [])
    assert resolve(resolver, "to-sub/b") == (n["b"], [])
    assert resolve(resolver, "to-sub/to-a") == (n["a"], [])
    link, _ = resolve(resolver, "to-sub/to-a", follow_last=False)
    assert isinstance(link, Symlink) and link.target == "../a"
    assert resolve(resolver, "abs") == (n["a"], [])          # via the mount point


def test_a_missing_own_component_is_handed_back_for_mkdir_p(tree):
    resolver, n = tree
    assert resolve(resolver, "to-sub/x/y") == (n["sub"], ["x", "y"])
    with pytest.raises(NotFound, match="dangling"):
        resolve(resolver, "dangling")


@pytest.mark.parametrize("path, errno", [("host", "EXDEV"), ("up", "EXDEV"),
                                         ("loop1", "ELOOP")])
def test_what_leads_outside_or_nowhere_is_refused(tree, path, errno):
    resolver, _ = tree
    with pytest.raises(UsageError) as exc:
        resolve(resolver, path)
    assert exc.value.details["errno"] == errno


def test_without_a_mount_point_no_absolute_target_is_followed(tree):
    resolver, _ = tree
    resolver.mountpoint = None
    with pytest.raises(UsageError, match="outside the namespace"):
        resolve(resolver, "abs")


def test_a_link_opens_no_way_the_caller_could_not_walk(tree):
    resolver, n = tree
    assert resolve(resolver, "secret") == (n["c"], [])
    with pytest.raises(PermissionDenied):
        resolve(resolver, "secret", BOB)
    with pytest.raises(NotFound, match="not a directory"):
        resolve(resolver, "data/a/x")


def test_a_chain_of_links_up_to_the_limit(tree):
    resolver, n = tree
    root = n["root"]
    previous = "data/a"
    for i in range(MAX_HOPS):
        new(Symlink, f"hop{i}", root, target=previous)
        previous = f"hop{i}"
    assert resolve(resolver, f"hop{MAX_HOPS - 1}") == (n["a"], [])
    new(Symlink, "one-more", root, target=previous)
    with pytest.raises(UsageError, match="too many levels"):
        resolve(resolver, "one-more")


@pytest.mark.parametrize("target, words", [
    ("", "cannot be empty"),
    ("a\0b", "NUL"),
    ("x" * (MAX_TARGET_BYTES + 1), f"at most {MAX_TARGET_BYTES}"),
    ("\ud800", "surrogate"),
    (5, "must be a string"),
])
def test_a_bad_target_is_refused(target, words):
    with pytest.raises(UsageError, match=words):
        check_target(target)


def test_any_other_target_is_kept_as_given():
    for target in ("/anywhere/at/all", "../..", "\udcff", "x" * MAX_TARGET_BYTES):
        assert check_target(target) == target
