"""The answers of gpumemd's ops as types (docs/protocol.md, "Requests and answers" and
"Objects"): what daemon/core/describe.py builds, what `gpumemctl.Client` returns, and what the CLI
and the monitor (tui/) read, so that mypy finds every reader of a field that is renamed or
removed. TypedDicts: at run time each answer is the plain dict the wire carries.

Only for annotations: the client library imports this module under TYPE_CHECKING, so the
CLI's start-up never pays for `typing`.
"""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

# ---- nodes (`ls`, `info`, `create`, ...) -----------------------------------------------------
HolderKind = Literal["lease", "read", "write", "attach-r", "attach-w"]
SpecialType = Literal["fifo", "socket", "char-device", "block-device"]


class Container(TypedDict):
    """The container a holder's process ran in, from its cgroup path (docs/operations.md,
    "Containers"): `runtime` docker, containerd, cri-o, podman, cri (a Kubernetes container
    whose runtime the path does not name) or kubernetes (a pod's own cgroup, `id` null);
    `pod` the Kubernetes pod UID, or null."""
    runtime: str
    id: str | None
    pod: str | None


class Holder(TypedDict):
    """Something keeping an allocation alive: a lease, a handle, an attachment. `cgroup`
    (null: unknown) and `container` (null: none) were read once when it was made."""
    id: int
    kind: HolderKind
    pid: int
    uid: int
    session: int
    since_ns: int
    cgroup: str | None
    container: Container | None
    parked: bool            # an attachment that let go of its mapping while asleep


class ContainerHeld(TypedDict):
    """`status`'s `containers`: memory held per container ("" where unknown)."""
    runtime: str
    id: str
    pod: str
    held_bytes: int
    holders: int


class NodeCommon(TypedDict):
    """What every node has. `names` (`info`, `create`): each path it has that the caller may
    search to; `metadata` (`info`): its user metadata, null without read permission."""
    id: int
    path: str
    name: str
    uid: int
    gid: int
    mode: str                       # octal, permission bits only: "0640"
    created: str                    # ISO 8601 UTC with microseconds
    modified: str
    changed: str
    links: int
    names: NotRequired[list[str]]
    metadata: NotRequired[dict[str, str] | None]


class Directory(NodeCommon):
    type: Literal["directory"]
    entries: int
    durable: bool                   # its durable default (issue 27): what is made in it from
                                    # now on is durable; what it holds keeps its own


class Symlink(NodeCommon):
    type: Literal["symlink"]
    target: str


class Special(NodeCommon):
    """A FIFO, socket or device node: metadata only. A device node has rdev, major, minor."""
    type: SpecialType
    rdev: NotRequired[int]
    major: NotRequired[int]
    minor: NotRequired[int]


class Allocation(NodeCommon):
    type: Literal["allocation"]
    size: int                       # bytes asked for
    capacity: int | None
    device: str | None              # the device's UUID
    durable: bool
    state: str                      # pending, ready, degraded, lost, restoring or asleep
    ecc: str                        # rs or none
    refcount: int                   # holders, and the durable pin
    leased: bool
    unsealed: bool
    damaged: list[list[int]]        # [start, end) byte ranges that read as EIO
    verified: str | None            # ISO time of the last full verify pass; null: never
    snapshot: str | None
    snapshot_time: str | None
    holders: NotRequired[list[Holder]]      # info, create, link, seal
    # The sizes of the extents its memory is made of, where there are several (a large
    # allocation grown without a copy, cuda backend): open/attach send one fd each.
    extents: NotRequired[list[int]]
    region: NotRequired[dict[str, int]]     # open/attach of a slot: {offset, span}


Node = Allocation | Directory | Symlink | Special


class Hello(TypedDict):
    version: int
    daemon: str                     # "gpumemd 0.1.0"
    pid: int
    backend: str
    session: int


# ---- status and devices ------------------------------------------------------------------------
class DaemonInfo(TypedDict):
    socket: str
    state_dir: str
    keeper_kind: str
    mount: str | None               # the mount point; null: none
    pid: int
    version: str
    uptime_s: float
    backend: str


class KeeperInfo(TypedDict, total=False):
    """The keeper process, or systemd's fd store (`max_fds`); `error` when not alive."""
    kind: str
    alive: bool
    pid: int | None
    held: int
    fds: int
    max_fds: int | None
    socket: str | None
    error: str


class SlabUse(TypedDict):
    """A device's slabs: how many, their bytes, their parity's, the bytes of the slots in
    use and the small allocations in them, the slack (bytes - used_bytes) and the
    fragmentation (1 - used / bytes over the slabs partly used, 0.0 to 1.0: docs/storage.md)."""
    count: int
    bytes: int
    parity_bytes: int
    used_bytes: int
    objects: int
    slack_bytes: int
    fragmentation: float


class ArenaUse(TypedDict):
    """A device's parity arenas: how many, their bytes, the bytes of their spans in use, and
    how many spans (docs/storage.md, "Parity arenas")."""
    count: int
    bytes: int
    used_bytes: int
    spans: int


class Device(TypedDict):
    """A device of the backend with NVML telemetry (docs/telemetry.md): each telemetry field
    is null where NVML cannot say, and `telemetry` is "nvml" or "unavailable: REASON"."""
    index: int
    uuid: str
    name: str
    total: int                      # bytes the backend may hand out
    free: int
    granularity: int
    backend: str
    ours: int                       # bytes our allocations (and parity) hold on it
    slabs: SlabUse                  # its slabs (issue 26, docs/storage.md)
    parity_arenas: ArenaUse         # its parity arenas (issue 26, docs/storage.md)
    telemetry: str
    nvml_index: int | None
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    utilization_gpu: int | None
    utilization_memory: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    ecc_enabled: bool | None
    ecc_enabled_pending: bool | None
    ecc_volatile_corrected: int | None
    ecc_volatile_uncorrected: int | None
    ecc_aggregate_corrected: int | None
    ecc_aggregate_uncorrected: int | None
    remapped_correctable: int | None
    remapped_uncorrectable: int | None
    remapped_pending: bool | None
    remapped_failure: bool | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    telemetry_at: float | None
    health: DeviceHealth            # what NVML reported of it (issue 28, docs/telemetry.md)


class DeviceHealth(TypedDict):
    """A device's health (daemon/services/health.py): `state` ok, degraded or lost; the
    last critical incident's `cause` (xid, ecc_double, remap_pending), `xid` and `at` (Unix
    time); `counts` of incidents per cause; `monitor`: how it is watched."""
    state: str
    cause: str | None
    xid: int | None
    at: float | None
    counts: dict[str, int]
    monitor: str


class GpuEvent(TypedDict):
    """`debug_gpu_event`'s answer: the incident, the device's state after it, and what was
    done: allocations on the device, how many were marked lost or queued for a verify."""
    action: str
    device: str
    index: int | None
    cause: str
    xid: int | None
    state: str
    injected: bool
    allocations: int
    lost: int
    verifying: int


class Totals(TypedDict):
    allocations: int
    directories: int
    durable: int
    size: int
    capacity: int
    by_state: dict[str, int]
    asleep_bytes: int               # host memory holding asleep allocations' bytes
    sessions: int
    holders: int


class ScrubCounts(TypedDict):
    """What a scrub (or one allocation of it) found; docs/ecc.md."""
    bytes: int
    blocks: int
    clean: int
    corrected: int
    uncorrectable: int
    skipped: int
    symbols: int


class ScrubLifetime(ScrubCounts):
    runs: int


class ScrubAllocation(ScrubCounts):
    path: str
    seconds: float
    rate: float | None
    finished_ns: int


class ScrubRun(TypedDict):
    """A scrub that ended (`last`). `error`: it failed and stopped."""
    started_ns: int
    finished_ns: int
    stopped: bool
    seconds: float
    busy_seconds: float
    totals: ScrubCounts
    rate: float | None
    allocations: dict[str, ScrubAllocation]
    error: NotRequired[str]


class ScrubStatus(TypedDict, total=False):
    """The answer of `scrub` (docs/ecc.md): while `running`, the progress so far."""
    running: bool
    rate: int | None                # the limit asked for, bytes/s; null: a duty cycle
    started_ns: int
    to_scrub: int
    elapsed: float
    totals: ScrubCounts
    progress: float
    rate_now: float
    eta_seconds: float | None
    last: ScrubRun | None
    lifetime: ScrubLifetime


class ScrubLast(TypedDict):
    finished_ns: int
    stopped: bool
    seconds: float
    totals: ScrubCounts


class ScrubSummary(TypedDict, total=False):
    """`status`'s scrub part: `state` "running", "idle" or "unavailable"."""
    state: Literal["running", "idle", "unavailable"]
    progress: float
    totals: ScrubCounts
    eta_seconds: float | None
    to_scrub: int
    rate_now: float
    rate_limit: int | None
    started_ns: int
    last: ScrubLast | None
    lifetime: ScrubLifetime
    default_rate: int | None


class Quota(TypedDict):
    uid: int
    quota: int
    used: int


class Status(TypedDict):
    daemon: DaemonInfo
    keeper: KeeperInfo
    devices: list[Device]
    totals: Totals
    scrub: ScrubSummary
    quotas: list[Quota]
    snapshots: dict[str, dict]      # action -> the administrator's newest snapshot_report
    containers: list[ContainerHeld]  # memory held per container (the caller's own holders
                                     # but for root and the daemon's user)


# ---- events ------------------------------------------------------------------------------------
class Event(TypedDict):
    """An event of the log; `detail`'s keys depend on `kind` (daemon/core/events.py SCHEMA)."""
    id: int
    time_ns: int
    kind: str
    node: int | None
    path: str | None
    uid: int | None
    pid: int | None
    detail: dict


class EventsAnswer(TypedDict):
    events: list[Event]
    complete: bool


class SubscribeAnswer(EventsAnswer):
    last_event: int


class EventItem(TypedDict):
    """An item of Client.subscribe(): an event..."""
    type: Literal["event"]
    event: Event


class ChangedItem(TypedDict):
    """...or the nodes that changed (coalesced), as two parallel lists."""
    type: Literal["changed"]
    nodes: list[int]
    paths: list[str]


Change = EventItem | ChangedItem


# ---- verify, recover, check --------------------------------------------------------------------
class VerifyProgress(TypedDict):
    """A progress frame of `verify` or `recover` with progress."""
    path: str | None
    done_bytes: int
    total_bytes: int
    allocations_done: int
    allocations: int


class Verified(TypedDict):
    """One allocation's result (docs/ecc.md). `skipped_reason`: not verified at all (no
    ECC, or its state); `repair` "not permitted": damage left in another's allocation."""
    path: str
    id: int
    ecc: str
    blocks: int
    clean: int
    corrected: int
    uncorrectable: int
    skipped: int
    symbols: int
    bytes: int
    damaged: list[int]              # blocks found damaged and not repaired
    uncorrectable_blocks: list[int]
    damaged_ranges: NotRequired[list[list[int]]]
    skipped_reason: NotRequired[str]
    repair: NotRequired[str]


class VerifySummary(TypedDict):
    blocks: int
    clean: int
    corrected: int
    uncorrectable: int
    skipped: int
    symbols: int
    bytes: int
    unrepaired: int
    allocations: int
    exit: int                       # 0 clean, 1 all repaired, 8 damage left


class VerifyResult(TypedDict):
    allocations: list[Verified]     # those that fit in one answer, damage first
    summary: VerifySummary          # over all of them
    complete: bool
    left_out: int


class RecoverResult(TypedDict):
    allocation: Verified
    info: Allocation


class Problem(TypedDict):
    check: str
    message: str
    repaired: bool


class CheckResult(TypedDict):
    clean: bool
    checks: list[str]
    problems: list[Problem]
    repaired: bool


class Compacted(TypedDict):
    """`compact` (docs/protocol.md): objects moved (the first 1000; `moved_count` counts
    all), each with its slab and slot before and after (`to.slot` null in a dry run),
    objects of the slabs to empty left where they are and why, and the slabs emptied with
    the bytes they gave back (data and parity). `path` is null for a caller who is not root
    or the daemon's user."""
    dry_run: bool
    moved: list[dict[str, Any]]
    moved_count: int
    moved_bytes: int
    skipped: list[dict[str, Any]]
    skipped_count: int
    slabs_freed: list[dict[str, Any]]
    freed_bytes: int


# ---- the rest ---------------------------------------------------------------------------------
class MetaSet(TypedDict):
    path: str
    key: str
    bytes: int


class MetaRemoved(TypedDict):
    path: str
    key: str


class Corrupted(TypedDict):
    path: str
    offset: int
    length: int
    parity: bool
