"""The verbs of checking: verify and repair by ECC (`verify`, `recover`, the scrubber's
pieces), `check` (an fsck of registry, tree, backend and keeper: daemon/core/check.py) and fault
injection (`debug corrupt`)."""
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

    def corrupt(self, path: str, cred: Credentials, offset: int, length: int,
                pattern: bytes, parity: bool) -> dict:
        """Fault injection (gpumemd --enable-fault-injection only; root or the daemon's
        uid): overwrite bytes of the data or of the parity, without updating the parity."""
        if not self.fault_injection:
            raise PermissionDenied("fault injection is off: start gpumemd with "
                                   "--enable-fault-injection to use `debug corrupt`")
        if not (cred.is_root or cred.uid == os.geteuid()):
            raise PermissionDenied("permission denied: `debug corrupt` is for root and the "
                                   "daemon's user only")
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

