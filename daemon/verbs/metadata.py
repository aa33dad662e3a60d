"""The verbs of user metadata (issue 17; daemon/core/usermeta.py has what a key and a value may be
and the bounds). By path for the socket (`meta_*`: links followed, as `info` does; read
permission to get or list, write permission to set or remove, search permission on the way),
and by node for the mount's user.KEY attributes, whose permissions the kernel has checked
(`authorised`: default_permissions, and Linux's rules for user.* names)."""
from __future__ import annotations

from gpumemctl.protocol import Exists, NotFound, PermissionDenied, UsageError, name_from_bytes

from ..core import usermeta
from ..core.describe import describe
from ..core.journal import Journal
from ..core.namespace import Namespace
from ..core.nodes import Allocation, Directory, Node
from ..core.permissions import Credentials, R, W, require


class MetadataVerbs:
    def __init__(self, journal: Journal, namespace: Namespace, bounds: usermeta.Bounds):
        self.journal = journal
        self.ns = namespace
        self.bounds = bounds

    # ---- by path (the socket) ---------------------------------------------------------------
    def meta_list(self, path: str, cred: Credentials) -> dict:
        node = self._metadata_node(path, cred)
        require(node, cred, R, "read the metadata of")
        return {"path": node.path, "metadata": usermeta.shown(node.metadata)}

    def meta_get(self, path: str, key: str, cred: Credentials) -> dict:
        raw = usermeta.key_bytes(key)
        node = self._metadata_node(path, cred)
        value = self.metadata_value(node, raw, cred)
        return {"path": node.path, "key": name_from_bytes(raw),
                "value": name_from_bytes(value)}

    def meta_set(self, path: str, key: str, value: str, cred: Credentials, *,
                 create: bool = False, replace: bool = False) -> dict:
        raw, data = usermeta.key_bytes(key), usermeta.value_bytes(value, key)
        node = self._metadata_node(path, cred)
        self.set_metadata(node, raw, data, cred, create=create, replace=replace)
        return {"path": node.path, "key": name_from_bytes(raw), "bytes": len(data)}

    def meta_rm(self, path: str, key: str, cred: Credentials) -> dict:
        raw = usermeta.key_bytes(key)
        node = self._metadata_node(path, cred)
        self.remove_metadata(node, raw, cred)
        return {"path": node.path, "key": name_from_bytes(raw)}

    def _metadata_node(self, path: str, cred: Credentials) -> Node:
        node = self.ns.lookup(path, cred, allow_root=True)
        if not isinstance(node, (Allocation, Directory)):
            raise UsageError(f"'{node.path}' is a {describe(node)['type']}: {usermeta.ONLY_ON}",
                             details={"errno": "EPERM"})
        return node

    # ---- by node (the mount's user.KEY attributes) ------------------------------------------
    def metadata_value(self, node: Node, key: bytes, cred: Credentials, *,
                       authorised: bool = False) -> bytes:
        """One value (getxattr(2) of user.KEY); NotFound (ENODATA) when there is none."""
        if not authorised:
            require(node, cred, R, "read the metadata of")
        value = node.metadata.get(key)
        if value is None:
            raise NotFound(f"no metadata key '{name_from_bytes(key)}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        return value

    def set_metadata(self, node: Node, key: bytes, value: bytes, cred: Credentials, *,
                     create: bool = False, replace: bool = False,
                     authorised: bool = False) -> None:
        """Set one key (setxattr(2) of user.KEY; `create`, `replace`: XATTR_CREATE and
        XATTR_REPLACE). The bounds are checked first; one transaction, its event `meta`
        names the key, never the value."""
        if create and replace:
            raise UsageError("create and replace exclude each other: a key cannot both be "
                             "absent and present")
        self._require_metadata_write(node, cred, authorised)
        old = node.metadata.get(key)
        shown = name_from_bytes(key)
        if create and old is not None:
            raise Exists(f"metadata key '{shown}' exists on '{node.path or '/'}'",
                         details={"errno": "EEXIST"})
        if replace and old is None:
            raise NotFound(f"no metadata key '{shown}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        after = node.metadata_bytes + len(key) + len(value) - \
            (len(key) + len(old) if old is not None else 0)
        self.bounds.check(node.path or "/", node.uid, node.metadata_bytes, after)
        with self.journal.change(**_metadata_commit(node)):
            self.ns.metadata.set(node, key, value)
            self.journal.event("meta", node, cred, action="set", key=shown, bytes=len(value))

    def remove_metadata(self, node: Node, key: bytes, cred: Credentials, *,
                        authorised: bool = False) -> None:
        """removexattr(2) of user.KEY; NotFound (ENODATA) when there is none."""
        self._require_metadata_write(node, cred, authorised)
        if key not in node.metadata:
            raise NotFound(f"no metadata key '{name_from_bytes(key)}' on '{node.path or '/'}'",
                           details={"errno": "ENODATA"})
        with self.journal.change(**_metadata_commit(node)):
            self.ns.metadata.set(node, key, None)
            self.journal.event("meta", node, cred, action="rm", key=name_from_bytes(key))

    def _require_metadata_write(self, node: Node, cred: Credentials, authorised: bool) -> None:
        if not isinstance(node, (Allocation, Directory)):
            raise UsageError(f"'{node.path}' is a {describe(node)['type']}: {usermeta.ONLY_ON}",
                             details={"errno": "EPERM"})
        if self.ns.node_or_none(node.id) is not node:
            raise NotFound(f"'{node.path}' was removed: its metadata cannot change",
                           details={"errno": "ENOENT"})
        if authorised:
            return
        require(node, cred, W, "change the metadata of")
        # Linux's rule for user.* attributes: in a sticky directory (such as the root, 1777)
        # only its owner (or root) may write them, as only they may remove others' entries.
        if isinstance(node, Directory) and node.mode & 0o1000 and \
                not (cred.is_root or cred.uid == node.uid):
            raise PermissionDenied(f"permission denied: '{node.path or '/'}' is sticky; only "
                                   f"its owner (uid {node.uid}) may change its metadata",
                                   details={"errno": "EPERM"})


def _metadata_commit(node: Node) -> dict:
    """The journal change of a metadata change: fsynced for a durable allocation, as its
    other attributes are; batched for a transient one (gone after any restart); committed
    for a directory, as mkdir is."""
    durable = isinstance(node, Allocation) and node.durable
    return {"durable": durable, "batch": isinstance(node, Allocation) and not durable}
