"""The verbs of checking: verify and repair by ECC (`verify`, `recover`, the scrubber's
pieces), `check` (an fsck of registry, tree, backend and keeper: daemon/core/check.py), fault
injection (`debug corrupt`, `debug gpu-event`) and what GPU health needs (the allocations on
a device, a device's allocations marked lost: daemon/services/health.py)."""
from __future__ import annotations

import os
from typing import Any

from gpumemctl.protocol import PermissionDenied

from ..core.check import Checker
from ..core.custody import Custody
from ..core.integrity import Integrity
from ..core.namespace import Namespace
from ..core.nodes import Allocation
from ..core.permissions import Credentials
from ..registry import Registry
from .plan import Plan, breathing


class Checks:
    def __init__(self, registry: Registry, keeper: Any, namespace: Namespace,
                 custody: Custody, integrity: Integrity, *, fault_injection: bool = False):
        """`keeper`: ProcessKeeper or SystemdFdStore (daemon/keeper/link.py);
        `fault_injection`: gpumemd --enable-fault-injection (`debug corrupt`)."""
        self.registry = registry
        self.keeper = keeper
        self.ns = namespace
        self.custody = custody
        self.integrity = integrity
        self.fault_injection = fault_injection

    # ---- ECC (docs/ecc.md) --------------------------------------------------------------------
    protected_bytes = staticmethod(Integrity.protected_bytes)

    @property
    def chunk_blocks(self) -> int:
        """The blocks of one piece of ECC work (verify yields after each)."""
        return self.integrity.chunk_blocks

    def ecc_targets(self, paths: list[str], cred: Credentials, everything: bool
                    ) -> list[Allocation]:
        return self.ns.reports.ecc_targets(paths, cred, everything)

    def verify(self, alloc: Allocation, repair: bool, first_block: int = 0) -> Plan[dict]:
        """Verify (and repair) piece by piece (Integrity.verify_steps), breathing between
        pieces: the loop serves everyone else meanwhile. A repair rewrites bytes, so a cache
        of the old ones (the mount's pages) is dropped."""
        total = yield from breathing(self.integrity.verify_steps(alloc, repair, first_block))
        if total.get("corrected") and not alloc.unlinked:
            self.ns.watchers.data_changed(alloc)
        return total

    def require_fault_injection(self, cred: Credentials, what: str) -> None:
        """Fault injection is on (gpumemd --enable-fault-injection) and `cred` is root or
        the daemon's uid; else PermissionDenied (exit 6)."""
        if not self.fault_injection:
            raise PermissionDenied("fault injection is off: start gpumemd with "
                                   f"--enable-fault-injection to use `{what}`")
        if not (cred.is_root or cred.uid == os.geteuid()):
            raise PermissionDenied(f"permission denied: `{what}` is for root and the "
                                   "daemon's user only")

    def on_device(self, device: str) -> list[Allocation]:
        """The allocations whose memory is on the device with UUID `device` (in id order):
        what a GPU health incident may have hit. Lost and pending ones hold none."""
        return sorted((a for a in self.ns.allocations()
                       if a.device == device and not a.unlinked
                       and a.state not in ("lost", "pending", "restoring")), key=lambda a: a.id)

    def note_gpu_health(self, detail: dict, allocs: list[Allocation], named: int) -> None:
        """One change: the `gpu_health` event everyone may see (`detail` and the count of
        `allocs`, no names), and one per owner of `allocs` naming that owner's (their count,
        the first `named` paths and ids): events.visible_to shows a user only their own."""
        journal = self.ns.journal
        owners: dict[int, list[Allocation]] = {}
        for alloc in allocs:
            owners.setdefault(alloc.uid, []).append(alloc)
        with journal.change(durable=False):
            journal.event("gpu_health", None, None, **detail, allocations=len(allocs))
            for uid, own in sorted(owners.items()):
                journal.event("gpu_health", None, Credentials(pid=os.getpid(), uid=uid, gid=-1),
                              **detail, allocations=len(own),
                              paths=[a.path for a in own[:named]],
                              ids=[a.id for a in own[:named]])

    def mark_lost(self, allocs: list[Allocation], reason: str) -> list[Allocation]:
        """The device under `allocs` fell off the bus: its memory is gone, as after a reboot
        or a GPU reset. In one change each becomes `lost` (its row, a `lost` event), so that
        `snapshot restore --lost-only` (or restore_on_start) refills it; then its keeper copy
        and its memory go. One that a client holds open (a handle, an attachment, a file on
        the mount) is marked lost too, but its memory stays until the daemon restarts: the
        holder's close must still find it (no new open is let in: require_memory).
        Returns those marked."""
        marked = [a for a in allocs if a.state not in ("lost", "pending", "restoring")
                  and not a.unlinked]
        if not marked:
            return []
        journal = self.ns.journal
        with journal.change(durable=True):
            for alloc in marked:
                journal.keep(alloc, "state")
                alloc.state = "lost"
                self.registry.nodes.update(alloc.id, state="lost", slab=None, slot=None)
                journal.event("lost", alloc, None, reason=reason)
        for alloc in marked:
            if any(h.kind != "lease" for h in alloc.holders.values()):
                continue
            if alloc.durable:
                self.custody.withdraw_quietly(alloc.id)
            self.custody.free(alloc)
            journal.node_changed(alloc)
        return marked

    def corrupt(self, path: str, cred: Credentials, offset: int, length: int,
                pattern: bytes, parity: bool) -> dict:
        """Fault injection (gpumemd --enable-fault-injection only; root or the daemon's
        uid): overwrite bytes of the data or of the parity, without updating the parity."""
        self.require_fault_injection(cred, "debug corrupt")
        alloc = self.ns.lookup_allocation(path, cred)
        self.custody.require_memory(alloc)
        result = self.integrity.corrupt(alloc, cred, offset, length, pattern, parity)
        if not parity:
            self.ns.watchers.data_changed(alloc)  # the mount reads the damage, as the socket does
        return result

    # ---- check (daemon/core/check.py) ----------------------------------------------------
    def check(self, repair: bool = False, *, integrity_errors: list[str] | None = None) -> dict:
        """`gpumemctl check`. `integrity_errors`: SQLite's integrity check, made beforehand
        off the event loop (registry_integrity_errors)."""
        return Checker(self.ns, self.custody, self.registry, self.keeper).run(
            repair=repair, integrity_errors=integrity_errors)

    def registry_integrity_errors(self) -> list[str]:
        """SQLite's integrity check on a read-only connection of its own: safe on a worker
        thread while the loop goes on changing the registry."""
        return self.registry.integrity_errors_readonly()

