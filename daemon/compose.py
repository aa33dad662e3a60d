"""The composition of the daemon's core and its verbs: each layer built once, each verb group
given exactly the layers it needs. daemon/main.py builds the daemon with it, and
tests/unit/world.py the unit tier's, the same way."""
from __future__ import annotations

import dataclasses
from typing import Any

from .backends import Backend
from .backends.packed import PackedBackend
from .core import usermeta
from .core.adoption import Adoption
from .core.arenas import Arenas
from .core.compaction import Compaction
from .core.creation import Creation
from .core.custody import Custody
from .core.holders import Holders
from .core.integrity import Integrity
from .core.journal import Journal
from .core.lifecycle import Lifecycle
from .core.namespace import Namespace
from .core.permissions import administrative_uid
from .core.quotas import Quotas
from .core.refills import Refills
from .core.sizing import Sizing
from .core.slabs import Slabs
from .core.sleep import Sleep
from .registry import Registry
from .verbs import Verbs
from .verbs.checks import Checks
from .verbs.compaction import CompactionVerbs
from .verbs.copies import CopyVerbs
from .verbs.data import DataVerbs
from .verbs.durability import DurabilityVerbs
from .verbs.handles import HandleVerbs
from .verbs.many import ManyVerbs
from .verbs.metadata import MetadataVerbs
from .verbs.names import NameVerbs
from .verbs.queries import Queries
from .verbs.refill import RefillVerbs, SnapshotRecords
from .verbs.reports import Reports
from .verbs.service import ServiceVerbs
from .verbs.sleep import SleepVerbs


@dataclasses.dataclass(frozen=True)
class Core:
    """The layers under the verbs (docs/architecture.md), for the composition root only."""
    registry: Registry
    backend: PackedBackend
    keeper: Any                 # ProcessKeeper or SystemdFdStore (daemon/keeper/link.py)
    journal: Journal
    ns: Namespace
    integrity: Integrity
    custody: Custody
    adoption: Adoption
    holders: Holders
    quotas: Quotas
    meta_bounds: usermeta.Bounds
    lifecycle: Lifecycle
    sizing: Sizing
    creation: Creation
    refills: Refills
    compactor: Compaction         # slabs compacted (docs/storage.md)
    sleep: Sleep                  # sleep and wake (docs/engines.md)


@dataclasses.dataclass(frozen=True)
class Config:
    """The configuration the core and the verbs take (gpumemd's options and config keys)."""
    fault_injection: bool = False     # --enable-fault-injection (`debug corrupt`)
    default_ecc: str = "rs"           # config `ecc`: the ECC of creates that name none
    quotas: dict[int, int] | None = None   # config [quotas]: uid -> capacity in bytes
    default_quota: int | None = None  # every other uid's but root's and the daemon's
    max_names_per_uid: int | None = None    # None: no limit
    max_handles_per_uid: int | None = None
    fds_to_readers: bool = False      # config cuda_fds_to_readers
    mountpoint: str | None = None     # absolute link targets under it are followed
    metadata_max_bytes: int = usermeta.DEFAULT_MAX_BYTES        # daemon/core/usermeta.py
    metadata_user_max_bytes: int = usermeta.DEFAULT_USER_MAX_BYTES
    slabs: bool = True                # config `slabs`: small allocations packed (storage.md)
    parity_arenas: bool = True        # config `parity_arenas`: parity in spans (storage.md)
    extents: bool = True              # config `extents`: resizes by extents (storage.md)
    compact_min_slack: int | None = 64 << 20   # config `compact_min_slack` (0: never by itself)


def build(registry: Registry, backend: Backend, keeper: Any,
          config: Config | None = None) -> tuple[Core, Verbs]:
    """The core over `registry`, `backend` and `keeper`, and the verbs over it."""
    core = build_core(registry, backend, keeper, config or Config())
    return core, build_verbs(core, config or Config())


def build_core(registry: Registry, backend: Backend, keeper: Any, config: Config) -> Core:
    # The core addresses memory through the packing layer: small allocations in slabs.
    backend = backend if isinstance(backend, PackedBackend) else \
        PackedBackend(backend, slabs=config.slabs, extents=config.extents)
    journal = Journal(registry)
    ns = Namespace(registry, journal)
    ns.max_names_per_uid = config.max_names_per_uid
    ns.resolver.mountpoint = config.mountpoint
    integrity = Integrity(registry, journal, backend)
    custody = Custody(registry, journal, backend, keeper, ns, integrity.parity,
                      Slabs(registry, journal, backend, keeper),
                      Arenas(registry, journal, backend, keeper, enabled=config.parity_arenas))
    holders = Holders(registry, journal)
    holders.max_per_uid = config.max_handles_per_uid
    quotas = Quotas(ns.allocations, config.quotas, kept=holders.unlinked_held,
                    default=config.default_quota, exempt=administrative_uid)
    bounds = usermeta.Bounds(config.metadata_max_bytes, config.metadata_user_max_bytes,
                             used=ns.metadata.used, exempt=administrative_uid)
    lifecycle = Lifecycle(registry, journal, ns, custody, integrity, holders)
    sleep = Sleep(registry, journal, backend, custody, integrity)
    return Core(
        registry, backend, keeper, journal, ns, integrity, custody,
        Adoption(registry, journal, backend, keeper, ns, integrity.parity, custody, sleep),
        holders, quotas, bounds, lifecycle,
        Sizing(registry, journal, ns, backend, custody, integrity, holders, quotas),
        Creation(journal, ns, backend, custody, integrity, holders, quotas, bounds,
                 config.default_ecc),
        Refills(registry, journal, ns, custody, integrity, lifecycle),
        Compaction(registry, journal, backend, custody), sleep)


def build_verbs(c: Core, config: Config) -> Verbs:
    return Verbs(
        names=NameVerbs(c.journal, c.ns, c.custody, c.holders, c.quotas, c.creation,
                        c.lifecycle, c.sizing),
        data=DataVerbs(c.journal, c.ns, c.backend, c.custody, c.integrity, c.quotas,
                       c.sizing),
        copies=CopyVerbs(c.journal, c.ns, c.backend, c.custody, c.integrity, c.holders,
                         c.sizing),
        many=ManyVerbs(c.journal, c.creation),
        durability=DurabilityVerbs(c.ns, c.custody, c.lifecycle),
        handles=HandleVerbs(c.registry, c.journal, c.ns, c.backend, c.custody, c.integrity,
                            c.holders, c.sizing, c.lifecycle, c.refills,
                            fds_to_readers=config.fds_to_readers),
        refill=RefillVerbs(c.registry, c.journal, c.ns, c.backend, c.custody, c.integrity,
                           c.holders, c.creation, c.refills, c.meta_bounds, c.sizing),
        records=SnapshotRecords(c.registry, c.journal, c.ns),
        metadata=MetadataVerbs(c.journal, c.ns, c.meta_bounds),
        queries=Queries(c.ns),
        reports=Reports(c.registry, c.journal, c.ns, c.backend, c.keeper, c.holders,
                        c.quotas),
        checks=Checks(c.registry, c.keeper, c.ns, c.custody, c.integrity,
                      fault_injection=config.fault_injection),
        service=ServiceVerbs(c.registry, c.journal, c.ns, c.custody, c.adoption, c.integrity,
                             c.keeper, c.sleep),
        compaction=CompactionVerbs(c.compactor, c.journal,
                                   min_slack=config.compact_min_slack),
        sleep=SleepVerbs(c.ns, c.backend, c.custody, c.holders, c.sizing, c.sleep))


def start(verbs: Verbs, orphans: str = "refuse") -> dict:
    """Start-up, once built: the registry loaded, the keeper's memory re-adopted
    (ServiceVerbs.start), the administrator's snapshot reports of earlier runs read back.
    Returns the summary the `start` event logs."""
    summary = verbs.service.start(orphans)
    verbs.records.load()
    return summary
