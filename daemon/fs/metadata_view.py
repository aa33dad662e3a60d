"""The `.metadata` mirror at the mount's root: `/.metadata/<path>` mirrors the tree
read-only, directories as directories, each allocation as a file holding what
`gpumemctl info --json` prints. It is hidden from the root's listing (like ZFS's .zfs) and
is never an allocation (docs/mount.md, "/.metadata").

The mirror of node N has inode META_BASE + N, so an inode says by itself which view it is
(is_meta). Its files are read with direct I/O: the text is made per open, for the opener,
and the size a stat shows is only a guess at it.
"""
from __future__ import annotations

import errno
import json
import os
import stat

import pyfuse3

from gpumemctl.protocol import NotFound

from ..core.describe import describe
from ..core.nodes import Directory, Node
from ..core.permissions import Credentials, R, allowed
from ..verbs.queries import Queries
from .attrs import entry_attributes

META_NAME = ".metadata"
META_BASE = 1 << 62          # the .metadata mirror of node N has inode META_BASE + N


def is_meta(inode: int) -> bool:
    """Whether `inode` is a node's mirror under /.metadata (the mirror's root included)."""
    return inode >= META_BASE


def meta_text(node: Node, cred: Credentials | None = None) -> bytes:
    """What `gpumemctl info --json` prints for `cred`: the user metadata when it may read
    the node, null when not, and the names it may search to. Without `cred` (the size in
    a stat, which is only a guess: the file is read with direct I/O) both are left out."""
    metadata = None if cred is None else allowed(node, cred, R)
    shown = describe(node, holders=True, metadata=metadata, names=cred is not None,
                     cred=cred)
    return (json.dumps(shown, indent=2) + "\n").encode()


def meta_attrs(node: Node) -> pyfuse3.EntryAttributes:
    """The mirror's attributes: a directory read-only, anything else a 0444 file the size
    of its text; never cached, as sizes and contents change all the time."""
    a = entry_attributes(node)
    a.st_ino = META_BASE + node.id
    if isinstance(node, Directory):
        a.st_mode = stat.S_IFDIR | (node.mode & 0o555)
    else:
        a.st_mode, a.st_nlink = stat.S_IFREG | 0o444, 1
        a.st_size, a.st_blocks = len(meta_text(node)), 0
    a.entry_timeout = a.attr_timeout = 0
    return a


class MetaHandle:
    """An open .metadata file: the JSON, fixed at open so reads are consistent."""

    def __init__(self, text: bytes):
        self.text = text


class MetadataView:
    """The mirror's nodes, found through the queries (it changes nothing)."""

    def __init__(self, queries: Queries):
        self.queries = queries

    def node(self, inode: int) -> Node:
        """The node a mirror inode shows."""
        node = self.queries.node_or_none(inode - META_BASE)
        if node is None:
            raise NotFound(f"no metadata inode {inode}")
        return node

    def lookup(self, parent_inode: int, name: str, cred: Credentials
               ) -> pyfuse3.EntryAttributes:
        """A name in a mirrored directory, by the same rules as in the tree."""
        parent = self.node(parent_inode)
        return meta_attrs(self.queries.lookup_child(parent.id, name, cred))

    def open(self, inode: int, flags: int, cred: Credentials) -> MetaHandle:
        """A mirror file opened for reading (EROFS for writing): its text, for `cred`."""
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise pyfuse3.FUSEError(errno.EROFS)
        return MetaHandle(meta_text(self.node(inode), cred))
