"""The verbs: one class per group, each built with exactly the layers it needs
(daemon/compose.py), none importing another. A verb with a slow step returns a plan,
which daemon/verbs/plan.py's runner executes (docs/architecture.md).

`Verbs` is what the adapters are given (the socket server, the mount, check, the scrubber,
main.py): the groups, and nothing of its own.
"""
from __future__ import annotations

import dataclasses

from .checks import Checks
from .compaction import CompactionVerbs
from .copies import CopyVerbs
from .data import DataVerbs
from .durability import DurabilityVerbs
from .handles import HandleVerbs
from .many import ManyVerbs
from .metadata import MetadataVerbs
from .names import NameVerbs
from .queries import Queries
from .refill import RefillVerbs, SnapshotRecords
from .reports import Reports
from .service import ServiceVerbs
from .sleep import SleepVerbs


@dataclasses.dataclass(frozen=True)
class Verbs:
    names: NameVerbs            # create, mkdir, rm, rename, links, special files, attributes
    data: DataVerbs             # resize, the mount's reads and writes, read by copy, fsync
    copies: CopyVerbs           # writes by copy through the socket (write_many)
    many: ManyVerbs             # creates of a batch sharing one commit (create_many)
    durability: DurabilityVerbs  # durable / transient
    handles: HandleVerbs        # open, attach, close, detach, seal, revoke; mount files; sessions
    refill: RefillVerbs         # refilling from a snapshot
    records: SnapshotRecords    # what clients report of their snapshots
    metadata: MetadataVerbs     # user metadata
    queries: Queries            # lookups, listings, info
    reports: Reports            # status, devices, quotas, the event log and its observers
    checks: Checks              # verify and repair, check, fault injection
    service: ServiceVerbs       # start, stop, the keeper's repairs
    compaction: CompactionVerbs  # slabs compacted: by the administrator, by housekeeping
    sleep: SleepVerbs           # sleep and wake, and an attachment's remap


__all__ = ["Verbs"]
