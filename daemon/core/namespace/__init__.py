"""The namespace: the tree of directories and allocations, and the POSIX rules over it
(docs/architecture.md, "The core"). One layer of the core, composed of parts, as the
registry is: `Namespace` (tree.py) owns the tree and its lookups and holds one of each part,
which its callers name (`ns.renames.move(...)`, `ns.metadata.set(...)`).

- tree.py: `Namespace`: the nodes by id and the root, lookups by path and by id, new nodes
  and directories, a node forgotten; it loads the tree from the registry;
- entries.py: `ns.entries`, the tree's in-memory steps, each with its undo (the journal);
- watchers.py: `ns.watchers`, who is told of what the kernel may have cached, and each
  allocation's data generation;
- ids.py: `ns.ids`, node ids given and reserved ahead of their rows;
- hardlinks.py: `ns.hardlinks`, a node's further names (link(2), unlink(2) of one name);
- metadata.py: `ns.metadata`, user metadata on the nodes and each uid's total of it;
- renames.py: `ns.renames`, rename(2) and renameat2(RENAME_EXCHANGE);
- attributes.py: `ns.attributes`, chmod, chown, utimens and access times;
- reports.py: `ns.reports`, totals, bytes per device, what a verify covers;
- lostfound.py: `ns.lost_found`, the daemon's private directories for recovered memory;
- rules.py: the POSIX checks the parts and the verbs share (functions over nodes);
- rows.py: registry rows as nodes.

The parts never import one another (an import-linter contract): each reaches the others
through the namespace it is given. The names below are what the rest of the tree imports
from `daemon.core.namespace`.
"""
from __future__ import annotations

from .attributes import NOW, RELATIME_NS
from .hardlinks import MAX_LINKS
from .rows import SEALED, UNSEALED, WRITING
from .rules import check_mode
from .tree import RESERVED_AT_ROOT, Namespace

__all__ = [
    "MAX_LINKS", "NOW", "RELATIME_NS", "RESERVED_AT_ROOT", "SEALED", "UNSEALED", "WRITING",
    "Namespace", "check_mode",
]
