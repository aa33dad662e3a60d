"""The handlers of `status` and `devices`: the daemon's facts, the keeper, devices with NVML
telemetry and their health (docs/telemetry.md), totals, the scrub's progress and quotas; and
`debug_gpu_event` (a GPU health incident injected, daemon/services/health.py)."""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import trio

from gpumemctl.protocol import InternalError
from gpumemctl.protocol.release import VERSION

from ..services import nvml
from .call import Call, Reply, own_uid_unless_privileged

if TYPE_CHECKING:
    from ..services.health import HealthMonitor
    from ..services.scrub import Scrubber


async def status(call: Call) -> Reply:
    server, reports = call.server, call.verbs.reports
    return {
        "daemon": {**server.info, "pid": os.getpid(), "version": VERSION,
                   "uptime_s": round(time.time() - server.started, 3),
                   "backend": reports.backend_name},
        "keeper": reports.keeper_info(),
        "devices": await devices_with_telemetry(reports, server.health),
        "totals": reports.totals(),
        "scrub": scrub_summary(server.scrubber),
        # Per-uid limits and use (config [quotas]): all of them for root and the daemon's
        # user, one's own for anyone else.
        "quotas": reports.quota_report(own_uid_unless_privileged(call.session)),
        # The administrator's newest snapshot create, restore and verify
        # (daemon/verbs/refill.py).
        "snapshots": call.verbs.records.last_snapshots,
        # Memory held per container (daemon/core/containers.py): every holder's for root
        # and the daemon's user, one's own for anyone else.
        "containers": reports.held_per_container(own_uid_unless_privileged(call.session)),
    }, []


async def devices(call: Call) -> Reply:
    return {"devices": await devices_with_telemetry(call.verbs.reports, call.server.health)}, []


async def debug_gpu_event(call: Call) -> Reply:
    health = call.server.health
    if health is None:
        raise InternalError("this gpumemd has no GPU health monitor")
    a = call.args
    return health.inject(call.session.cred, a["device"], a["xid"], a["ecc"], a["remap"]), []


def with_health(devices: list[dict], health: HealthMonitor | None) -> list[dict]:
    """Each device with its `health` (daemon/services/health.py; `ok` without a monitor)."""
    if health is None:
        return [{**d, "health": {"state": "ok", "cause": None, "xid": None, "at": None,
                                 "counts": {}, "monitor": "unavailable"}} for d in devices]
    return [{**d, "health": health.health_of(d["uuid"])} for d in devices]


async def devices_with_telemetry(reports: Any, health: HealthMonitor | None = None
                                 ) -> list[dict]:
    return with_health(await _devices_with_telemetry(reports), health)


async def _devices_with_telemetry(reports: Any) -> list[dict]:
    """The backend's devices, the bytes our allocations hold on each, and NVML telemetry.
    The NVML snapshot is taken on a worker thread: a slow driver never stalls the server.
    (`reports` is Any: tests/unit/test_nvml.py passes a stand-in with only backend_name,
    devices() and bytes_held_per_device().)"""
    ours = reports.bytes_held_per_device()
    backend = reports.backend_name
    slabs = reports.slabs_per_device() if hasattr(reports, "slabs_per_device") else {}
    empty = {"count": 0, "bytes": 0, "parity_bytes": 0, "used_bytes": 0, "objects": 0,
             "slack_bytes": 0, "fragmentation": 0.0}
    arenas = reports.arenas_per_device() if hasattr(reports, "arenas_per_device") else {}
    no_arenas = {"count": 0, "bytes": 0, "used_bytes": 0, "spans": 0}
    listed = [{**d.to_dict(), "backend": backend, "ours": ours.get(d.uuid, 0),
               "slabs": slabs.get(d.uuid, empty),
               "parity_arenas": arenas.get(d.uuid, no_arenas)} for d in reports.devices()]
    if backend == "host":          # memfd memory: there is no GPU to ask about
        return [{**d, **nvml.unavailable_fields("the host backend has no GPU")}
                for d in listed]
    # abandon_on_cancel: a driver call that hangs must not hold up the daemon's stop.
    snap = await trio.to_thread.run_sync(nvml.snapshot, abandon_on_cancel=True)
    return [{**d, **snap.fields_for(d["uuid"])} for d in listed]


def scrub_summary(scrubber: Scrubber | None) -> dict:
    """`status`'s scrub part: the running scrub's progress, the last result (also while one
    runs: alerts on it must not flap), and the counters over every scrub."""
    if scrubber is None:
        return {"state": "unavailable"}
    st = scrubber.status()
    last = st.get("last")
    common = {"last": None if not last else
              {k: last[k] for k in ("finished_ns", "stopped", "seconds", "totals")},
              "lifetime": scrubber.lifetime(),
              "default_rate": scrubber.default_rate}
    if st.get("running"):
        return {"state": "running", "progress": st["progress"], "totals": st["totals"],
                "eta_seconds": st["eta_seconds"], "to_scrub": st["to_scrub"],
                "rate_now": st["rate_now"], "rate_limit": st.get("rate"),
                "started_ns": st["started_ns"], **common}
    return {"state": "idle", **common}
