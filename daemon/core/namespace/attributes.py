"""A node's attributes: chmod, chown and utimensat(2) with POSIX's rules of who may change
what, the access time a read moves by Linux's relatime rule, and a directory's durable
default (issue 27).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumemctl.protocol import PermissionDenied

from ..nodes import Allocation, Directory, Node
from ..permissions import Credentials, W, allowed, require
from .rules import check_mode, has_durable

if TYPE_CHECKING:
    from .tree import Namespace

RELATIME_NS = 24 * 3600 * 10**9   # relatime: an access time older than this moves on a read
NOW = "now"                       # setattr(mtime_ns=NOW): utimensat's UTIME_NOW


class Attributes:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def setattr(self, node_id: int, cred: Credentials, *, mode: int | None = None,
                uid: int | None = None, gid: int | None = None,
                mtime_ns: int | str | None = None, atime_ns: int | str | None = None,
                authorised: bool = False, charge: Callable[[int, int], None]) -> Node:
        """chmod / chown / utimens. chmod: owner or root. chown: only root changes the
        owner; the owner may change the group to one it belongs to; a change of ownership
        clears an allocation's setuid/setgid bits. Times: an explicit time needs owner or
        root, NOW (the string 'now') needs write permission, as utimensat(2) says; atime_ns
        sets the access time (note_access moves it on reads).
        `authorised`: the kernel has applied these rules already (the mount runs with
        default_permissions, and only it knows whether a time was UTIME_NOW). `charge`:
        the quota check for a new owner (Quotas.check)."""
        node, actor = self.ns.node(node_id), cred
        if authorised:
            cred = dataclasses.replace(cred, uid=0)    # passes every check below
        changes = _ownership_changes(node, cred, mode, uid, gid, charge)
        _check_times(node, cred, mtime_ns, atime_ns)
        now = time.time_ns()
        if mtime_ns is not None:
            changes["modified_ns"] = now if mtime_ns == NOW else int(mtime_ns)
        if atime_ns is not None:
            changes["accessed_ns"] = now if atime_ns == NOW else int(atime_ns)
        changes["changed_ns"] = now
        self._apply(node, changes, actor)
        self.ns.watchers.attrs_changed(node)
        return node

    def _apply(self, node: Node, changes: dict, actor: Credentials) -> None:
        """The checked changes, in memory, in the node's row and in the owners' counts, in
        one change with its event."""
        ns = self.ns
        with ns.journal.change(durable=has_durable(node),
                               batch=isinstance(node, Allocation) and not node.durable):
            ns.registry.nodes.update(node.id, **changes)
            ns.journal.keep(node, *changes)
            if "uid" in changes and ns.nodes.get(node.id) is node:
                old_uid, new_uid = node.uid, changes["uid"]
                ns.nodes.reowned(node, old_uid, new_uid)
                ns.journal.on_rollback(lambda: ns.nodes.reowned(node, new_uid, old_uid))
            for key, value in changes.items():
                setattr(node, key, value)
            ns.journal.event("setattr", node, actor, **{k: (f"{v:04o}" if k == "mode" else v)
                                                        for k, v in changes.items()})

    def set_durable_default(self, directory: Directory, cred: Credentials,
                            durable: bool) -> None:
        """A directory's durable default (issue 27): what is made in it from now on is
        durable (its new files, and its new subdirectories, which carry the default on).
        Its owner or root may change it, as chmod (EPERM otherwise); what is in it already
        keeps its own durability. Committed with an fsync, as a durable change is."""
        _require_owner_eperm(directory, cred, "change the durable default of")
        if directory.durable == durable:
            return
        ns = self.ns
        with ns.journal.change(durable=True):
            ns.journal.keep(directory, "durable", "changed_ns")
            directory.durable = durable
            directory.changed_ns = time.time_ns()
            ns.registry.nodes.update(directory.id, durable=int(durable),
                                     changed_ns=directory.changed_ns)
            ns.journal.event("durable" if durable else "transient", directory, cred)
        ns.watchers.attrs_changed(directory)

    def note_access(self, node: Node) -> None:
        """A read or a listing on the mount: move the access time by Linux's relatime rule
        (only when it is not after the modification or change time, or is a day old), so
        the registry is written once per change or per day, not at every read."""
        now = time.time_ns()
        accessed = node.accessed_ns or 0
        if accessed > max(node.modified_ns, node.changed_ns) and \
                now - accessed < RELATIME_NS:
            return
        if self.ns.nodes.get(node.id) is not node:    # an unlinked file has no row left
            node.accessed_ns = now
            return
        # Never fsynced: an access time lost to a power cut harms nobody.
        with self.ns.journal.change(
                durable=False, batch=isinstance(node, Allocation) and not node.durable):
            self.ns.registry.nodes.update(node.id, accessed_ns=now)
            self.ns.journal.keep(node, "accessed_ns")
            node.accessed_ns = now


def _ownership_changes(node: Node, cred: Credentials, mode: int | None, uid: int | None,
                       gid: int | None, charge: Callable[[int, int], None]) -> dict:
    """The mode, owner and group changes `cred` may make, checked in that order; a change
    of ownership clears a file's setuid and setgid bits."""
    changes: dict = {}
    if mode is not None:
        _require_owner_eperm(node, cred, "change the mode of")
        changes["mode"] = check_mode(mode)
    if uid is not None and uid != node.uid:
        if not cred.is_root:
            raise PermissionDenied(f"permission denied: only root may change the owner "
                                   f"of '{node.path}'", details={"errno": "EPERM"})
        changes["uid"] = uid
        if isinstance(node, Allocation) and node.buffer is not None:
            charge(uid, node.capacity or 0)      # the new owner pays for it (quotas)
    if gid is not None and gid != node.gid:
        if not (cred.is_root or (cred.uid == node.uid and cred.in_group(gid))):
            raise PermissionDenied(f"permission denied: uid {cred.uid} may not give "
                                   f"'{node.path}' to group {gid}",
                                   details={"errno": "EPERM"})
        changes["gid"] = gid
    if ("uid" in changes or "gid" in changes) and not isinstance(node, Directory):
        changes["mode"] = changes.get("mode", node.mode) & ~0o6000
    return changes


def _check_times(node: Node, cred: Credentials, mtime_ns: int | str | None,
                 atime_ns: int | str | None) -> None:
    """utimensat(2)'s rule: NOW needs the owner or write permission, an explicit time the
    owner or root."""
    for value in (mtime_ns, atime_ns):
        if value == NOW:
            if not (cred.uid == node.uid or allowed(node, cred, W)):
                require(node, cred, W)
        elif value is not None:
            _require_owner_eperm(node, cred, "set the times of")


def _require_owner_eperm(node: Node, cred: Credentials, what: str) -> None:
    if not (cred.is_root or cred.uid == node.uid):
        raise PermissionDenied(f"permission denied: only the owner (uid {node.uid}) or "
                               f"root may {what} '{node.path or '/'}'",
                               details={"errno": "EPERM"})
