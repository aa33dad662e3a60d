"""POSIX permission checks on credentials (daemon/core/permissions.py): the owner, group and
other bits, root, supplementary groups, the sticky rule, who is the administrator, and where a
peer's groups come from."""
from __future__ import annotations

import os
import socket

import pytest

from daemon.core.nodes import Allocation, Directory
from daemon.core.permissions import (
    Credentials,
    R,
    W,
    X,
    administrative_uid,
    allowed,
    may_remove_from,
    peer_groups,
    require,
    require_owner,
    supplementary_groups,
)
from gpumemctl.protocol import PermissionDenied

from .parts import ALICE, BOB, ROOT

CAROL_IN_ALICES_GROUP = Credentials(pid=1, uid=1002, gid=1002, groups=frozenset({1000}))


def node(mode: int, uid: int = 1000, gid: int = 1000, name: str = "f") -> Allocation:
    top = Directory(id=1, name="", parent=None, uid=0, gid=0, mode=0o1777, created_ns=1,
                    modified_ns=1, changed_ns=1)
    return Allocation(id=2, name=name, parent=top, uid=uid, gid=gid, mode=mode,
                      created_ns=1, modified_ns=1, changed_ns=1)


@pytest.mark.parametrize("mode, cred, want, ok", [
    (0o600, ALICE, R | W, True),                # the owner's bits
    (0o600, BOB, R, False),
    (0o060, ALICE, R, False),                   # the owner's bits count, not the group's
    (0o060, CAROL_IN_ALICES_GROUP, R | W, True),    # a supplementary group
    (0o006, BOB, R | W, True),                  # other
    (0o004, BOB, R | W, False),                 # all of `want` is needed
    (0o000, ROOT, R | W | X, True),             # root passes every check
    (0o100, ALICE, X, True),
])
def test_allowed_reads_the_bits_of_the_callers_class(mode, cred, want, ok):
    assert allowed(node(mode), cred, want) is ok


def test_a_primary_group_counts_as_the_group():
    member = Credentials(pid=1, uid=1005, gid=1000)
    assert member.in_group(1000) and not member.in_group(1001)
    assert allowed(node(0o640), member, R) and not allowed(node(0o640), member, W)


def test_require_names_the_caller_the_node_and_its_mode():
    with pytest.raises(PermissionDenied) as exc:
        require(node(0o640, name="secret"), BOB, W)
    message = str(exc.value)
    assert "uid 1001 may not write 'secret'" in message
    assert "owner 1000:1000" in message and "mode 0640" in message
    require(node(0o640), ALICE, R | W)          # allowed: nothing raised
    with pytest.raises(PermissionDenied, match="may not list"):
        require(node(0o000), BOB, R | X, "list")


def test_only_the_owner_or_root_passes_require_owner():
    require_owner(node(0o000), ALICE, "chmod")
    require_owner(node(0o000), ROOT, "chmod")
    with pytest.raises(PermissionDenied, match=r"only the owner \(uid 1000\) or root"):
        require_owner(node(0o777), BOB, "chmod")


def test_the_sticky_bit_keeps_others_entries():
    sticky = Directory(id=3, name="tmp", parent=None, uid=2000, gid=2000, mode=0o1777,
                       created_ns=1, modified_ns=1, changed_ns=1)
    alices = node(0o644, uid=1000)
    assert may_remove_from(sticky, alices, ALICE)           # its owner
    assert not may_remove_from(sticky, alices, BOB)
    assert may_remove_from(sticky, alices, ROOT)
    assert may_remove_from(sticky, alices, Credentials(pid=1, uid=2000, gid=1))  # the dir's
    plain = Directory(id=4, name="d", parent=None, uid=2000, gid=2000, mode=0o777,
                      created_ns=1, modified_ns=1, changed_ns=1)
    assert may_remove_from(plain, alices, BOB)


def test_the_administrator_is_root_and_the_daemons_own_uid():
    assert administrative_uid(0)
    assert administrative_uid(os.geteuid())
    assert not administrative_uid(1000) or os.geteuid() == 1000
    assert not administrative_uid(4242)


def test_a_peers_groups_are_its_supplementary_groups_at_connect():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_groups(a, os.getpid()) == frozenset(os.getgroups())


def test_supplementary_groups_from_proc():
    assert supplementary_groups(os.getpid()) == frozenset(os.getgroups())
    assert supplementary_groups(2**22 + 1) == frozenset()     # no such process
