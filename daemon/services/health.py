"""GPU health mapped onto allocations (issue 28, docs/telemetry.md "GPU health").

NVML reports critical XID errors, double-bit ECC errors, pending row remaps and retired
pages (daemon/services/gpuevents.py turns them into `Incident`s, on a worker thread). For
each incident on a device of the backend, on the event loop:

- the device's health: `ok`, `degraded` (ECC, a remap pending, a critical XID) or `lost`
  (XID 79: it fell off the bus); the last cause and when, and counts per cause. `status` and
  `devices` show it per device (`health`), `gpumemctl metrics` exports it. It lives in
  memory: a restart (after the reset or reboot such a GPU wants) begins at `ok`.
- a `gpu_health` event naming the device, the cause and the allocations on it: one that
  everyone sees with their count, and one per owner naming theirs (the first NAMED),
  Checks.note_gpu_health;
- a critical incident queues a verify (with repair) of those allocations at once, ahead of
  the scrub's schedule; a `gpu_health` event with action `verified` gives the result;
- a lost device's allocations become `lost` (Checks.mark_lost), as after a reboot: a
  snapshot restores them (`snapshot restore --lost-only`, restore_on_start).
- a non-critical XID (13, 31, 43...: an application's fault) is only recorded.

`gpumemctl debug gpu-event` (gpumemd --enable-fault-injection) feeds an incident into the
same path (`inject`): the host backend's device 0 is tested so in CI. A daemon on the host
backend never loads NVML; on the cuda backend a failure to load or to register events
leaves polling, or nothing (`monitor` in `health` says which).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import trio

from gpumemctl.protocol import NotFound, UsageError

from ..core.nodes import Allocation
from ..core.permissions import Credentials
from ..verbs import Verbs
from ..verbs.plan import run
from . import nvml
from .gpuevents import CAUSES, ECC_DOUBLE, REMAP_PENDING, XID, Incident, NvmlWatcher

log = logging.getLogger("gpumemd")

NAMED = 8                  # allocations an event names by path (the count names all)
STATES = ("ok", "degraded", "lost")


class DeviceHealth:
    def __init__(self) -> None:
        self.state = "ok"
        self.cause: str | None = None
        self.xid: int | None = None
        self.at: float | None = None             # Unix time of the last incident
        self.counts = {cause: 0 for cause in CAUSES}

    def to_dict(self, monitor: str) -> dict:
        return {"state": self.state, "cause": self.cause, "xid": self.xid, "at": self.at,
                "counts": dict(self.counts), "monitor": monitor}


class HealthMonitor:
    """`lib`: the pynvml module to watch through (a stand-in in tests); None: NVML's own
    (daemon/services/nvml.py), on the cuda backend only."""

    def __init__(self, verbs: Verbs, lib: Any = None, *, poll_s: float | None = None):
        self.v = verbs
        self.lib = lib
        self.poll_s = poll_s
        self.devices: dict[str, DeviceHealth] = {}
        self.monitor = "injection only" if verbs.reports.backend_name == "host" else \
            "starting"
        self._send, self._receive = trio.open_memory_channel[tuple[dict, list[int]]](math.inf)

    # ---- what status, devices and metrics show --------------------------------------------------
    def health_of(self, uuid: str) -> dict:
        dev = self.devices.get(uuid) or DeviceHealth()
        return dev.to_dict(self.monitor)

    # ---- incidents ----------------------------------------------------------------------------
    def inject(self, cred: Credentials, index: int, xid: int | None, ecc: str | None,
               remap: bool) -> dict:
        """`debug gpu-event`: root or the daemon's user, with fault injection on."""
        self.v.checks.require_fault_injection(cred, "debug gpu-event")
        given = (xid is not None) + (ecc is not None) + bool(remap)
        if given != 1:
            raise UsageError("name one event: --xid CODE, --ecc double or --remap")
        if ecc is not None and ecc != "double":
            raise UsageError(f"invalid --ecc {ecc!r}: only 'double' (a double-bit error)")
        if xid is not None and not 0 < xid < 1 << 31:
            raise UsageError(f"invalid --xid {xid}: a positive XID code")
        device = next((d for d in self.v.reports.devices() if d.index == index), None)
        if device is None:
            raise NotFound(f"no device {index} (`gpumemctl devices` lists them)")
        cause = XID if xid is not None else ECC_DOUBLE if ecc is not None else REMAP_PENDING
        return self.incident(Incident(device.uuid, cause, xid=xid, injected=True))

    def incident(self, inc: Incident) -> dict:
        """On the loop: the device's health, the events, the allocations marked lost or
        queued for a verify. Returns what was done (the answer of `debug gpu-event`)."""
        index = next((d.index for d in self.v.reports.devices() if d.uuid == inc.uuid), None)
        dev = self.devices.setdefault(inc.uuid, DeviceHealth())
        dev.counts[inc.cause] += 1
        if inc.critical:
            dev.cause, dev.xid, dev.at = inc.cause, inc.xid, time.time()
            if inc.lost:
                dev.state = "lost"
            elif dev.state != "lost":
                dev.state = "degraded"
        checks = self.v.checks
        allocs = checks.on_device(inc.uuid) if inc.critical else []
        detail = {"action": "incident", "device": inc.uuid, "index": index,
                  "cause": inc.cause, "xid": inc.xid, "state": dev.state,
                  "injected": inc.injected}
        log.warning("GPU health: device %s (%s) reported %s%s: %s, %d allocation(s) on it",
                    index, inc.uuid, inc.cause, "" if inc.xid is None else f" {inc.xid}",
                    dev.state, len(allocs))
        checks.note_gpu_health(detail, allocs, NAMED)
        lost: list = []
        if inc.lost and allocs:
            lost = checks.mark_lost(allocs, f"the device fell off the bus (XID {inc.xid})")
        elif allocs:
            self._send.send_nowait((detail, [a.id for a in allocs]))
        return {**detail, "allocations": len(allocs), "lost": len(lost),
                "verifying": 0 if inc.lost else len(allocs)}

    # ---- the task -------------------------------------------------------------------------------
    async def run(self) -> None:
        """The daemon's health task: verifies queued by incidents, and the NVML watcher on
        a worker thread (the cuda backend)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._verifier)
            if self.v.reports.backend_name != "host":
                nursery.start_soon(self._watch)

    async def _verifier(self) -> None:
        async for detail, ids in self._receive:
            totals = {"verified": 0, "clean": 0, "corrected": 0, "uncorrectable": 0,
                      "failed": 0}
            for alloc_id in ids:
                alloc = self.v.queries.node_or_none(alloc_id)
                if not isinstance(alloc, Allocation) or alloc.ecc != "rs" or \
                        alloc.buffer is None or alloc.state == "lost":
                    continue
                try:
                    result = await run(self.v.checks.verify(alloc, repair=True))
                except Exception as exc:  # noqa: BLE001 - gone or busy meanwhile: counted
                    log.info("GPU health: the verify of '%s' failed: %s", alloc.path, exc)
                    totals["failed"] += 1
                    continue
                totals["verified"] += 1
                for key in ("clean", "corrected", "uncorrectable"):
                    totals[key] += int(result.get(key, 0))
            try:
                self.v.reports.note("gpu_health", **{**detail, "action": "verified"},
                                    **totals)
            except Exception as exc:  # noqa: BLE001 - the verify ran: only its event is missing
                log.warning("GPU health: the verify's event was not logged: %s", exc)

    async def _watch(self) -> None:
        lib, failure = (self.lib, None) if self.lib is not None else \
            await trio.to_thread.run_sync(nvml.default().library, abandon_on_cancel=True)
        if lib is None:
            self.monitor = f"unavailable: {failure}"
            return
        uuids = [d.uuid for d in self.v.reports.devices()]
        kwargs = {} if self.poll_s is None else {"poll_s": self.poll_s}
        watcher = NvmlWatcher(lib, uuids, **kwargs)
        await trio.to_thread.run_sync(watcher.open, abandon_on_cancel=True)
        self.monitor = watcher.mode() if watcher.devices else \
            "unavailable: NVML lists none of the backend's devices"
        if not watcher.devices:
            return
        log.info("GPU health: watching %d device(s) (%s)", len(watcher.devices),
                 self.monitor)
        try:
            while True:
                # A wait of at most WAIT_MS on a worker thread: a stop cancels this await,
                # and the thread ends with its wait.
                found = await trio.to_thread.run_sync(watcher.step, abandon_on_cancel=True)
                for inc in found:
                    try:
                        self.incident(inc)
                    except Exception:
                        log.exception("GPU health: an incident on %s was not handled",
                                      inc.uuid)
        finally:
            watcher.close()
