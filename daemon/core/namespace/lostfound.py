"""lost+found: the daemon's own directories at the root, where start-up re-registers the memory
the keeper held and the registry did not list (daemon/core/orphans.py). Each start that
recovers something makes a new dated directory, closed to everyone but the daemon's user.
"""
from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

from ..nodes import Directory
from ..orphans import RECOVERY_DIR
from ..permissions import DAEMON

if TYPE_CHECKING:
    from .tree import Namespace


class LostFound:
    def __init__(self, ns: Namespace):
        self.ns = ns

    def recovery_dir(self) -> Directory:
        """A new /lost+found/<UTC time> for re-registered orphans. /lost+found is reused
        only if it is the daemon user's and closed to others (anyone may create entries at
        the root), else a free name beside it is taken."""
        top = self._private_dir(self.ns.root, RECOVERY_DIR, reuse=True)
        stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
        return self._private_dir(top, stamp, reuse=False)

    def _private_dir(self, parent: Directory, base: str, reuse: bool) -> Directory:
        for n in itertools.count(1):
            name = base if n == 1 else f"{base}-{n}"
            node = parent.children.get(name)
            if node is None:
                made = self.ns.insert_node(Directory, parent, name, DAEMON, 0o700)
                self.ns.journal.event("mkdir", made, None, mode="0700")
                return made
            if reuse and isinstance(node, Directory) and node.uid == DAEMON.uid \
                    and not node.mode & 0o077:
                return node
        raise AssertionError("unreachable")
