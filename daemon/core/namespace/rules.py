"""The POSIX rules that the namespace's changes and the verbs share, as checks over nodes
(no state of their own): what a mode may be, who may remove or replace an entry (write and
search on its directory, the sticky bit), where a directory may move, what `rm -r` removes
and in which order, who may search to a node, and whether a change must be fsynced.
"""
from __future__ import annotations

from gpumemctl.protocol import Exists, PermissionDenied, UsageError

from ..nodes import Allocation, Directory, Node, entry_path, walk
from ..permissions import Credentials, R, W, X, allowed, may_remove_from, require


def check_mode(mode: int) -> int:
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise UsageError(f"invalid mode {mode!r}: expected octal permission bits 0000-7777")
    return mode


def has_durable(node: Node | None) -> bool:
    """Whether a change to this node's row must be fsynced: it holds a durable
    allocation (a directory, anywhere below it)."""
    if node is None:
        return False
    return any(isinstance(n, Allocation) and n.durable for n in walk(node))


def require_removable(parent: Directory | None, node: Node, cred: Credentials,
                      what: str = "remove entries from") -> None:
    """`cred` may take `node`'s entry out of `parent`: write and search on it, and the
    sticky bit's rule; never the root's."""
    if parent is None:
        raise PermissionDenied("permission denied: the root cannot be removed or moved",
                               details={"errno": "EBUSY"})
    require(parent, cred, W | X, what)
    if not may_remove_from(parent, node, cred):
        raise sticky_denied(parent, node)


def sticky_denied(parent: Directory, node: Node) -> PermissionDenied:
    return PermissionDenied(
        f"permission denied: '{parent.path or '/'}' is sticky; only the owner of "
        f"'{node.path}' (uid {node.uid}) may remove or replace it")


def removal_order(parent: Directory, name: str, node: Node, cred: Credentials
                  ) -> list[tuple[Directory, str, Node]]:
    """The entries to remove for `rm -r` of `name` in `parent`: (directory, name,
    node), children before parents, each checked for permission before anything
    changes. A hard-linked file is in it once per name inside the tree."""
    order: list[tuple[Directory, str, Node]] = []
    # (directory, name, node, its children queued)
    stack: list[tuple[Directory, str, Node, bool]] = [(parent, name, node, False)]
    while stack:                  # post-order with a stack: a chain may be thousands deep
        d, n_name, n, queued = stack.pop()
        if isinstance(n, Directory) and not queued:
            require(n, cred, R | W | X, "remove entries from")
            stack.append((d, n_name, n, True))
            stack.extend((n, child_name, child, False) for child_name, child
                         in reversed(list(n.children.items())))
            continue
        require(d, cred, W | X, "remove entries from")
        if not may_remove_from(d, n, cred):
            raise PermissionDenied(
                f"permission denied: '{d.path or '/'}' is sticky; only the owner "
                f"of '{entry_path(d, n_name)}' (uid {n.uid}) may remove it")
        order.append((d, n_name, n))
    return order


def may_search_to(node: Node, cred: Credentials) -> bool:
    """Whether `cred` has search (x) permission on every directory above `node`: where
    it could look the node up (a removed node is judged by the directories it was in)."""
    directory = node.parent
    while directory is not None:
        if not allowed(directory, cred, X):
            return False
        directory = directory.parent
    return True


def check_dir_move(node: Directory, src_dir: Directory, dst_dir: Directory,
                   cred: Credentials) -> None:
    """No move into its own subtree; a move to another parent rewrites its '..', which
    needs write permission on the directory itself (as Linux requires)."""
    above: Node | None = dst_dir
    while above is not None:
        if above is node:
            raise UsageError(f"cannot move '{node.path}' into itself "
                             f"('{dst_dir.path}')")
        above = above.parent
    if src_dir is not dst_dir:
        require(node, cred, W, "move")


def check_replace(node: Node, target: Node, dst_dir: Directory, cred: Credentials,
                  replace: bool) -> None:
    """`node` may take the place of `target` in `dst_dir` (rename(2) over an entry):
    allowed at all, the sticky bit, the same kind (directory or not), an empty directory."""
    if not replace:
        raise Exists(f"'{target.path}' already exists")
    if not may_remove_from(dst_dir, target, cred):
        raise sticky_denied(dst_dir, target)
    if isinstance(node, Directory) and not isinstance(target, Directory):
        raise UsageError(f"cannot replace allocation '{target.path}' with a directory",
                         details={"errno": "ENOTDIR"})
    if not isinstance(node, Directory) and isinstance(target, Directory):
        raise UsageError(f"cannot replace directory '{target.path}' with an allocation",
                         details={"errno": "EISDIR"})
    if isinstance(target, Directory) and target.children:
        raise Exists(f"directory '{target.path}' is not empty",
                     details={"errno": "ENOTEMPTY"})
