"""`gpumemctl metrics`: one `status` answer in the Prometheus text exposition format.

Made for node_exporter's textfile collector (docs/metrics.md lists every metric). Everything
comes from a single `status` request, so the numbers are one consistent snapshot. Names
start with `gpumemd_` and carry their unit (`_bytes`, `_seconds`, `_ratio`); counters end
in `_total`. A field the status does not carry (NVML figures on the host backend, for one)
gives no sample, never a made-up 0. Standard library only: the CLI must start fast.
"""
from __future__ import annotations

import dataclasses
import math

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from typing import Any

    from .protocol.replies import (
        DaemonInfo,
        Device,
        KeeperInfo,
        ScrubCounts,
        ScrubLast,
        ScrubLifetime,
        ScrubSummary,
        Status,
        Totals,
    )

STATES = ("pending", "ready", "degraded", "lost", "restoring", "asleep")   # docs/design.md
SNAPSHOT_RESULTS = ("ok", "damaged", "failed", "partial")


@dataclasses.dataclass
class Family:
    name: str
    type: str                   # gauge or counter
    help: str
    samples: list[tuple[dict, float]] = dataclasses.field(default_factory=list)

    def add(self, value, **labels) -> None:
        if value is None:
            return
        self.samples.append((labels, float(value) if not isinstance(value, bool)
                             else float(int(value))))

    def to_dict(self) -> dict:
        return {"name": self.name, "type": self.type, "help": self.help,
                "samples": [{"labels": labels, "value": value}
                            for labels, value in self.samples]}


class Registry:
    """The families in the order they are first named."""

    def __init__(self):
        self.families: dict[str, Family] = {}

    def __call__(self, name: str, type_: str, help_: str) -> Family:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = Family(name, type_, help_)
        return family

    def gauge(self, name: str, help_: str, value=None, **labels) -> Family:
        family = self(name, "gauge", help_)
        family.add(value, **labels)
        return family

    def counter(self, name: str, help_: str, value=None, **labels) -> Family:
        family = self(name, "counter", help_)
        family.add(value, **labels)
        return family


def up_family(up: bool) -> Family:
    family = Family("gpumemd_up", "gauge",
                    "1 if gpumemd answered the status request, 0 if it is not running")
    family.add(1 if up else 0)
    return family


def collect(status: Status) -> list[Family]:
    r = Registry()
    r.families["gpumemd_up"] = up_family(True)
    _daemon(r, status.get("daemon") or {})
    _totals(r, status.get("totals") or {})
    _keeper(r, status.get("keeper") or {})
    for dev in status.get("devices") or []:
        _device(r, dev)
    _scrub(r, status.get("scrub") or {})
    for action, report in sorted((status.get("snapshots") or {}).items()):
        _snapshot(r, action, report)
    for c in status.get("containers") or []:
        r.gauge("gpumemd_container_held_bytes", "capacity of the allocations that at least "
                "one holder in the container holds (parity excluded)", c.get("held_bytes"),
                container=str(c.get("id") or ""), runtime=str(c.get("runtime") or ""),
                pod=str(c.get("pod") or ""))
        r.gauge("gpumemd_container_holders", "holders (handles, attachments, leases, files "
                "open on the mount) whose process ran in the container", c.get("holders"),
                container=str(c.get("id") or ""), runtime=str(c.get("runtime") or ""),
                pod=str(c.get("pod") or ""))
    for q in status.get("quotas") or []:
        uid = str(q["uid"])
        r.gauge("gpumemd_quota_bytes", "capacity the uid's allocations may hold ([quotas])",
                q.get("quota"), uid=uid)
        r.gauge("gpumemd_quota_used_bytes", "capacity the uid's allocations hold (parity "
                "excluded)", q.get("used"), uid=uid)
    return [f for f in r.families.values() if f.samples]


def _daemon(r: Registry, d: DaemonInfo) -> None:
    r.gauge("gpumemd_info", "always 1; the labels say which gpumemd this is", 1,
            version=str(d.get("version", "")), backend=str(d.get("backend", "")),
            keeper=str(d.get("keeper_kind", "")))
    r.gauge("gpumemd_uptime_seconds", "seconds since gpumemd started", d.get("uptime_s"))


def _totals(r: Registry, t: Totals) -> None:
    by_state = dict.fromkeys(STATES, 0)
    by_state.update(t.get("by_state") or {})
    for state, count in by_state.items():
        r.gauge("gpumemd_allocations", "allocations, by state", count, state=state)
    r.gauge("gpumemd_allocations_durable", "durable allocations", t.get("durable"))
    r.gauge("gpumemd_asleep_bytes", "host memory holding asleep allocations' bytes",
            t.get("asleep_bytes"))
    r.gauge("gpumemd_allocations_size_bytes", "sum of the allocations' sizes (as asked for)",
            t.get("size"))
    r.gauge("gpumemd_allocations_capacity_bytes", "sum of the capacity (size rounded up to "
            "the granularity) of the allocations that hold memory, parity excluded",
            t.get("capacity"))
    r.gauge("gpumemd_directories", "directories in the namespace (the root excluded)",
            t.get("directories"))
    r.gauge("gpumemd_sessions", "open client sessions (socket connections)",
            t.get("sessions"))
    r.gauge("gpumemd_holders", "holders: open handles, attachments and leases",
            t.get("holders"))


def _keeper(r: Registry, k: KeeperInfo) -> None:
    kind = str(k.get("kind", ""))
    r.gauge("gpumemd_keeper_up", "1 if the keeper (or systemd's fd store) answers",
            bool(k.get("alive")), kind=kind)
    r.gauge("gpumemd_keeper_allocations", "allocations whose fds the keeper holds",
            k.get("held"))
    r.gauge("gpumemd_keeper_fds", "file descriptors the keeper holds (data and parity)",
            k.get("fds"))


# NVML fields (docs/telemetry.md) -> (metric, type, help, scale). Only present values count.
NVML = (
    ("memory_total", "gpumemd_device_nvml_memory_total_bytes", "gauge",
     "device memory as NVML counts it", 1),
    ("memory_used", "gpumemd_device_nvml_memory_used_bytes", "gauge",
     "device memory used by every process on the GPU (NVML), ours included", 1),
    ("memory_free", "gpumemd_device_nvml_memory_free_bytes", "gauge",
     "device memory free (NVML)", 1),
    ("utilization_gpu", "gpumemd_device_utilization_gpu_ratio", "gauge",
     "share of the last sample period a kernel ran (NVML)", 0.01),
    ("utilization_memory", "gpumemd_device_utilization_memory_ratio", "gauge",
     "share of the last sample period device memory was read or written (NVML)", 0.01),
    ("temperature_c", "gpumemd_device_temperature_celsius", "gauge",
     "GPU core temperature", 1),
    ("power_w", "gpumemd_device_power_watts", "gauge", "power draw", 1),
    ("power_limit_w", "gpumemd_device_power_limit_watts", "gauge", "enforced power limit", 1),
    ("ecc_enabled", "gpumemd_device_ecc_enabled", "gauge",
     "1 if the GPU's own ECC is on", 1),
    ("ecc_volatile_corrected", "gpumemd_device_ecc_volatile_corrected_errors_total",
     "counter", "corrected ECC errors since the driver loaded", 1),
    ("ecc_volatile_uncorrected", "gpumemd_device_ecc_volatile_uncorrected_errors_total",
     "counter", "uncorrected ECC errors since the driver loaded", 1),
    ("ecc_aggregate_corrected", "gpumemd_device_ecc_aggregate_corrected_errors_total",
     "counter", "corrected ECC errors over the board's life", 1),
    ("ecc_aggregate_uncorrected", "gpumemd_device_ecc_aggregate_uncorrected_errors_total",
     "counter", "uncorrected ECC errors over the board's life", 1),
    ("remapped_correctable", "gpumemd_device_remapped_rows_correctable", "gauge",
     "rows remapped for correctable errors", 1),
    ("remapped_uncorrectable", "gpumemd_device_remapped_rows_uncorrectable", "gauge",
     "rows remapped for uncorrectable errors", 1),
    ("remapped_pending", "gpumemd_device_remapped_rows_pending", "gauge",
     "1 if a row remap waits for the next GPU reset", 1),
    ("remapped_failure", "gpumemd_device_remapped_rows_failure", "gauge",
     "1 if a row remap failed (the board needs service)", 1),
    ("pcie_gen", "gpumemd_device_pcie_link_generation", "gauge",
     "current PCIe link generation", 1),
    ("pcie_width", "gpumemd_device_pcie_link_width", "gauge", "current PCIe link width", 1),
)


# A device's slabs (issue 26, docs/storage.md): slack is slab bytes minus used bytes.
SLAB_GAUGES = (
    ("count", "gpumemd_slabs", "slabs holding small allocations on the device"),
    ("bytes", "gpumemd_slab_bytes", "bytes of the device's slabs (data)"),
    ("parity_bytes", "gpumemd_slab_parity_bytes", "bytes of the parity of the device's slabs"),
    ("used_bytes", "gpumemd_slab_used_bytes", "bytes of the slabs' slots that allocations use"),
    ("objects", "gpumemd_slab_objects", "small allocations in the device's slabs"),
    ("slack_bytes", "gpumemd_slab_slack_bytes", "bytes of the slabs' free slots (slab bytes "
     "minus used bytes)"),
    ("fragmentation", "gpumemd_slab_fragmentation", "share of the partly used slabs' bytes "
     "in free slots (0 to 1; `gpumemctl compact` gives it back)"),
)


# A device's parity arenas (issue 26, docs/storage.md "Parity arenas").
ARENA_GAUGES = (
    ("count", "gpumemd_parity_arenas", "parity arenas on the device"),
    ("bytes", "gpumemd_parity_arena_bytes", "bytes of the device's parity arenas"),
    ("used_bytes", "gpumemd_parity_arena_used_bytes", "bytes of the parity arenas' spans "
     "in use"),
    ("spans", "gpumemd_parity_arena_spans", "parity spans in use: one per allocation with "
     "ECC outside a slab, one per slab"),
)


def _device(r: Registry, dev: Device) -> None:
    labels = {"device": str(dev.get("uuid", "")), "index": str(dev.get("index", ""))}
    r.gauge("gpumemd_device_memory_total_bytes", "device memory (the backend's view)",
            dev.get("total"), **labels)
    r.gauge("gpumemd_device_memory_free_bytes", "device memory free (the backend's view)",
            dev.get("free"), **labels)
    r.gauge("gpumemd_device_memory_ours_bytes", "device memory gpumemd's allocations hold, "
            "parity included", dev.get("ours"), **labels)
    slabs: dict = dict(dev.get("slabs") or {})
    for key, name, help_ in SLAB_GAUGES:
        if isinstance(slabs.get(key), int | float):
            r.gauge(name, help_, slabs[key], **labels)
    arenas: dict = dict(dev.get("parity_arenas") or {})
    for key, name, help_ in ARENA_GAUGES:
        if isinstance(arenas.get(key), int | float):
            r.gauge(name, help_, arenas[key], **labels)
    for field, name, type_, help_, scale in NVML:
        value = dev.get(field)
        if not isinstance(value, int | float):      # None (NVML cannot say), or text
            continue
        r(name, type_, help_).add(value * scale if scale != 1 else value, **labels)
    _health(r, dev, labels)


HEALTH_STATES = ("ok", "degraded", "lost")             # docs/telemetry.md, "GPU health"
HEALTH_CAUSES = ("xid", "ecc_double", "remap_pending")


def _health(r: Registry, dev: Device, labels: dict) -> None:
    """The device's health (issue 28): one sample per state, 1 for the one it is in, and
    the incidents per cause since gpumemd started."""
    health: dict = dict(dev.get("health") or {})
    if not health.get("state"):
        return
    for state in HEALTH_STATES:
        r.gauge("gpumemd_device_health", "1 for the device's health state (ok, degraded: "
                "ECC, a remap pending or a critical XID; lost: fell off the bus), 0 for the "
                "others", health["state"] == state, **labels, state=state)
    counts: dict = dict(health.get("counts") or {})
    for cause in HEALTH_CAUSES:
        r("gpumemd_device_health_events_total", "counter", "GPU health incidents (NVML "
          "events, polled counters, injected ones) since gpumemd started, per cause").add(
            int(counts.get(cause, 0)), **labels, cause=cause)


def _scrub(r: Registry, s: ScrubSummary) -> None:
    state = s.get("state")
    if state in (None, "unavailable"):
        return
    r.gauge("gpumemd_scrub_running", "1 while a scrub runs", state == "running")
    if state == "running":
        r.gauge("gpumemd_scrub_progress_ratio", "share of the running scrub done",
                s.get("progress"))
    life: ScrubLifetime | dict[str, int] = s.get("lifetime") or {}
    r.counter("gpumemd_scrub_runs_total", "scrubs that ended (finished or stopped)",
              life.get("runs"))
    r.counter("gpumemd_scrub_bytes_total", "bytes scrubbed by the scrubs that ended",
              life.get("bytes"))
    r.counter("gpumemd_scrub_blocks_total", "blocks (128 KiB) scrubbed by the scrubs that "
              "ended", life.get("blocks"))
    r.counter("gpumemd_scrub_corrected_blocks_total", "blocks repaired by the scrubs that "
              "ended", life.get("corrected"))
    r.counter("gpumemd_scrub_uncorrectable_blocks_total", "blocks found damaged beyond "
              "repair by the scrubs that ended", life.get("uncorrectable"))
    last: ScrubLast | dict[str, Any] = s.get("last") or {}
    if last:
        totals: ScrubCounts | dict[str, int] = last.get("totals") or {}
        finished = last.get("finished_ns")
        r.gauge("gpumemd_scrub_last_finish_timestamp_seconds", "when the last scrub ended "
                "(Unix time)", None if finished is None else finished / 1e9)
        r.gauge("gpumemd_scrub_last_duration_seconds", "how long the last scrub took",
                last.get("seconds"))
        r.gauge("gpumemd_scrub_last_blocks", "blocks the last scrub checked",
                totals.get("blocks"))
        r.gauge("gpumemd_scrub_last_corrected_blocks", "blocks the last scrub repaired",
                totals.get("corrected"))
        r.gauge("gpumemd_scrub_last_uncorrectable_blocks", "blocks the last scrub found "
                "damaged beyond repair", totals.get("uncorrectable"))


# ---- the text format (https://prometheus.io/docs/instrumenting/exposition_formats/) -------
def _snapshot(r: Registry, action: str, rep: dict) -> None:
    """The administrator's newest snapshot create, restore and verify (docs/snapshots.md),
    one sample per `action`."""
    r.gauge("gpumemd_snapshot_last_timestamp_seconds", "when the newest snapshot create, "
            "restore or verify reported by the administrator ended", rep.get("time_ns", 0)
            / 1e9 if rep.get("time_ns") else None, action=action)
    r.gauge("gpumemd_snapshot_last_bytes", "bytes of the allocations it covered",
            rep.get("bytes"), action=action)
    r.gauge("gpumemd_snapshot_last_written_bytes", "bytes it wrote to the store (an "
            "incremental snapshot writes only changed blocks)", rep.get("bytes_written"),
            action=action)
    r.gauge("gpumemd_snapshot_last_duration_seconds", "how long it took",
            rep.get("duration_ms", 0) / 1000 if "duration_ms" in rep else None,
            action=action)
    for result in SNAPSHOT_RESULTS:
        r.gauge("gpumemd_snapshot_last_result", "1 for its result (ok, damaged, failed, "
                "partial), 0 for the others", rep.get("result") == result, action=action,
                result=result)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(value)


def render(families: list[Family]) -> str:
    lines: list[str] = []
    for f in families:
        lines.append(f"# HELP {f.name} {_escape_help(f.help)}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for labels, value in f.samples:
            body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{f.name}{{{body}}} {_number(value)}" if body
                         else f"{f.name} {_number(value)}")
    return "\n".join(lines) + "\n"
