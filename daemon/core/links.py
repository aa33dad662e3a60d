"""Symbolic links: the rules for a target, and path resolution through links for the socket
API (the mount's links are followed by the kernel, which asks only lookup and readlink).

How the socket API follows a link (docs/protocol.md, "Symbolic links"):
- every component but the last is followed, as path resolution in the kernel does; the last
  is followed or not by the verb (`rm` and `ls` do not, `info`, `read`, `write`, `open`,
  `attach` and the other verbs that act on an allocation do);
- a relative target is resolved from the directory that holds the link; `..` goes up, but
  never above the namespace root;
- an absolute target is a path on the host (the mount is where the namespace meets it): one
  under the daemon's mount point is followed from the namespace root, as the kernel would
  reach it through the mount; any other is refused (UsageError, errno EXDEV), since it
  leads outside the namespace;
- each directory passed needs search (x) permission, those reached through a link included,
  so a link never opens a way the caller could not walk itself;
- more than MAX_HOPS links in one resolution is ELOOP (UsageError: exit status 2), as
  Linux's limit of 40.
"""
from __future__ import annotations

from collections.abc import Callable

from gpumemctl.protocol import NotFound, UsageError, name_bytes

from .nodes import Directory, Node, Symlink
from .permissions import Credentials, X, require

MAX_HOPS = 40              # Linux's MAXSYMLINKS: more links than this in one walk is ELOOP
MAX_TARGET_BYTES = 4095    # PATH_MAX less its NUL, as symlink(2) allows


def check_target(target: str) -> str:
    """A target as symlink(2) takes it: any bytes but NUL, at least one, at most 4095."""
    if not isinstance(target, str):
        raise UsageError(f"a link target must be a string, not {type(target).__name__}")
    try:
        raw = name_bytes(target)
    except UnicodeEncodeError:
        raise UsageError("invalid link target: it holds a surrogate that stands for no "
                         "byte") from None
    if not raw:
        raise UsageError("a link target cannot be empty", details={"errno": "ENOENT"})
    if b"\0" in raw:
        raise UsageError("invalid link target: it contains a NUL byte")
    if len(raw) > MAX_TARGET_BYTES:
        raise UsageError(f"link target of {len(raw)} bytes, at most {MAX_TARGET_BYTES} "
                         "allowed", details={"errno": "ENAMETOOLONG"})
    return target


def too_many_links(path: str) -> UsageError:
    return UsageError(f"too many levels of symbolic links resolving '{path}' (more than "
                      f"{MAX_HOPS}: a loop?)", details={"errno": "ELOOP"})


class Resolver:
    """Walks socket API paths through the tree, following links. `mountpoint`: the
    daemon's mount point, or None (absolute targets are then never followed)."""

    def __init__(self, root: Callable[[], Directory], mountpoint: str | None = None):
        self._root = root
        self.mountpoint = mountpoint

    def resolve(self, parts: list[str], cred: Credentials, *, follow_last: bool
                ) -> tuple[Node, list[str]]:
        """(node, missing): the node `parts` names, missing == []; or, where one of the
        caller's own components is not there, the last directory reached and the caller's
        components from the missing one on (mkdir -p and create make them). A name missing
        inside a link's target is NotFound: the link dangles."""
        root = self._root()
        # A stack of (component, the caller's own?): a link's target goes on top.
        pending = [(part, True) for part in reversed(parts)]
        node: Node = root
        hops = 0
        whole = "/".join(parts)
        while pending:
            part, own = pending.pop()
            if part in ("", "."):
                continue
            if not isinstance(node, Directory):
                raise NotFound(f"'{node.path}' is not a directory (resolving '{whole}')",
                               details={"errno": "ENOTDIR"})
            require(node, cred, X)
            if part == "..":
                if node.parent is None:
                    raise UsageError(f"'{whole}' leads above the namespace root through a "
                                     "symbolic link", details={"errno": "EXDEV"})
                node = node.parent
                continue
            child = node.children.get(part)
            if child is None:
                if own:
                    return node, [part] + [p for p, _ in reversed(pending)]
                where = f"{node.path}/{part}" if node.path else part
                raise NotFound(f"'{whole}' leads through a dangling symbolic link: no "
                               f"'{where}'")
            if isinstance(child, Symlink) and (pending or follow_last):
                hops += 1
                if hops > MAX_HOPS:
                    raise too_many_links(whole)
                start, target_parts = self._target(child)
                if start is not None:
                    node = start
                pending.extend((p, False) for p in reversed(target_parts))
                continue
            node = child
        return node, []

    def _target(self, link: Symlink) -> tuple[Directory | None, list[str]]:
        """Where a link's target starts (None: the link's own directory) and its
        components."""
        target = link.target
        if not target.startswith("/"):
            return None, target.split("/")
        # The mount point's components, compared as they are spelled (no '..' folding: the
        # kernel resolves '..' through the tree, and so does resolve(), after the prefix).
        mount = self.mountpoint
        parts = [p for p in target.split("/") if p not in ("", ".")]
        prefix = [p for p in mount.split("/") if p not in ("", ".")] if mount else None
        if prefix is None or parts[:len(prefix)] != prefix:
            raise UsageError(f"symbolic link '{link.path}' points to '{target}', outside the "
                             f"namespace (the socket API follows an absolute target only "
                             f"under the mount point{f', {mount}' if mount else ''})",
                             details={"errno": "EXDEV"})
        return self._root(), parts[len(prefix):]
