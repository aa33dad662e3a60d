"""The verb of durability: `gpumemctl durable` (and `--transient`), and the mount's
`user.gpu.durable`. The order of its steps is daemon/core/lifecycle.py's: durable, deposit then
commit; transient, commit then withdraw.

On a directory the same verb sets its durable default (issue 27, ns.attributes): the files
and subdirectories made in it from then on are durable (daemon/core/creation.py); nothing
already in it changes."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.custody import Custody, Deposit
from ..core.describe import describe
from ..core.lifecycle import Lifecycle
from ..core.namespace import Namespace
from ..core.nodes import Allocation, Directory
from ..core.permissions import Credentials
from .plan import DEPOSITS, Exclusive, KeeperWork, Plan

if TYPE_CHECKING:
    from gpumemctl.protocol.replies import Node as NodeInfo


class DurabilityVerbs:
    def __init__(self, namespace: Namespace, custody: Custody, lifecycle: Lifecycle):
        self.ns = namespace
        self.custody = custody
        self.lifecycle = lifecycle

    def set_durable(self, path: str, cred: Credentials, durable: bool) -> Plan[NodeInfo]:
        """By path (the socket). Made durable, the deposit goes to the keeper off the loop,
        under the deposit lock, as a durable create's does; the commit then checks again
        (and deposits again if the memory changed meanwhile). A directory: its default."""
        node = self.ns.lookup(path, cred)
        if isinstance(node, Directory):
            return self.set_durable_node(node, cred, durable)
        if not durable:
            return self.set_durable_node(self.ns.lookup_allocation(path, cred), cred, False)
        yield Exclusive(DEPOSITS)
        deposit = self._handover(path, cred)
        if deposit is not None:
            yield KeeperWork(self.custody.send_begin(deposit))
        try:
            alloc = self.ns.lookup_allocation(path, cred)
            self.lifecycle.set_durable(alloc, cred, True, deposited=deposit)
        except BaseException:
            if deposit is not None:
                self.custody.withdraw_quietly(deposit.key)
            raise
        return describe(alloc, holders=True, cred=cred)

    def _handover(self, path: str, cred: Credentials) -> Deposit | None:
        """The first step: the checks, then the fds to send; None when there is nothing to
        deposit."""
        alloc = self.ns.lookup_allocation(path, cred)
        self.lifecycle.require_durability_change(alloc, cred)
        if alloc.durable or alloc.buffer is None:
            return None
        return self.custody.handover(alloc)

    def set_durable_node(self, node: Allocation | Directory, cred: Credentials,
                         durable: bool) -> NodeInfo:
        """By node: the mount's user.gpu.durable, answered in one step on the loop, the
        deposit made inside the commit's transaction (as it always was there). A
        directory's is its default: its owner or root may set it (EPERM otherwise)."""
        if isinstance(node, Directory):
            self.ns.attributes.set_durable_default(node, cred, durable)
            return describe(node, cred=cred)
        self.lifecycle.set_durable(node, cred, durable)
        return describe(node, holders=True, cred=cred)
