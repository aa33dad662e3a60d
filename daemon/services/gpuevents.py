"""What NVML says of a GPU's health, as incidents (issue 28; daemon/services/health.py acts on
them). It takes the pynvml module as `lib` (daemon/services/nvml.py loads it; tests pass a
stand-in) and runs on a worker thread: every call here may block on the driver.

Two ways of hearing, per device:
- events: an NVML event set (nvmlEventSetCreate) with the device registered
  (nvmlDeviceRegisterEvents) for critical XID errors and double-bit ECC errors, waited on
  with nvmlEventSetWait_v2 and a timeout (`wait(timeout_ms)`), so that the caller's loop
  stops within it. A device or driver that does not support a type (NotSupported: consumer
  boards have no ECC events, MIG, an old driver) is polled for it instead.
- polling (`poll()`, every POLL_S): the volatile double-bit ECC count (when its event is not
  registered), the retired pages pending (nvmlDeviceGetRetiredPagesPendingStatus) and the
  row remap pending (nvmlDeviceGetRemappedRows), which have no event at all. An incident is
  a change: the count grew, or pending went from false to true; the first reading is the
  baseline (what was there before the daemon started is `devices`' telemetry, not news).

Nothing raises out of here for an NVML error: a query NVML cannot answer is skipped.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from .nvml import normalise_uuid

log = logging.getLogger("gpumemd")

POLL_S = 5.0                 # counters polled this often
WAIT_MS = 1000               # one wait on the event set at most this long
# nvml.h: nvmlEventType*, and NVML_ERROR_TIMEOUT
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
_ERROR_TIMEOUT = 10
_UNCORRECTED, _VOLATILE = 1, 0

# XIDs that may mean data was hit (NVIDIA's XID catalogue): 48 double-bit ECC, 63/64 row
# remapping (page retirement) event/failure, 74 NVLink error, 79 fallen off the bus, 92 high
# single-bit ECC rate, 93 non-fatal uncorrectable ECC, 94 contained ECC error, 95
# uncontained ECC error. Any other XID (13: an application's graphics exception, 31: its
# page fault...) is noted, not acted on.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 93, 94, 95})
LOST_XIDS = frozenset({79})

XID, ECC_DOUBLE, REMAP_PENDING = "xid", "ecc_double", "remap_pending"
CAUSES = (XID, ECC_DOUBLE, REMAP_PENDING)


@dataclasses.dataclass(frozen=True)
class Incident:
    """One thing a device reported. `uuid`: NVML's (GPU-...), matched to the backend's."""
    uuid: str
    cause: str                   # one of CAUSES
    xid: int | None = None       # for cause "xid"
    injected: bool = False       # `gpumemctl debug gpu-event`, not NVML

    @property
    def lost(self) -> bool:
        return self.cause == XID and self.xid in LOST_XIDS

    @property
    def critical(self) -> bool:
        return self.cause != XID or self.xid in CRITICAL_XIDS


@dataclasses.dataclass
class _Watched:
    handle: Any
    uuid: str
    events: int = 0                       # event types registered for it
    ecc_double: int | None = None         # last volatile double-bit count seen
    retired_pending: bool | None = None
    remap_pending: bool | None = None


class NvmlWatcher:
    """The devices `uuids` (the backend's), watched through `lib`. Call `open()` once, then
    `step()` in a loop (on a worker thread), `close()` at the end."""

    def __init__(self, lib: Any, uuids: list[str], *, poll_s: float = POLL_S,
                 clock=time.monotonic):
        self.lib = lib
        self.wanted = {normalise_uuid(u): u for u in uuids}
        self.poll_s = poll_s
        self.clock = clock
        self.devices: list[_Watched] = []
        self.event_set: Any = None
        self._polled_at: float | None = None
        self._lock = threading.Lock()
        self._busy = self._closing = False

    # ---- setting up ------------------------------------------------------------------------
    def open(self) -> None:
        lib = self.lib
        count = self._q(lib.nvmlDeviceGetCount) or 0
        for index in range(count):
            handle = self._q(lib.nvmlDeviceGetHandleByIndex, index)
            uuid = None if handle is None else _text(self._q(lib.nvmlDeviceGetUUID, handle))
            if uuid is not None and normalise_uuid(uuid) in self.wanted:
                self.devices.append(_Watched(handle, self.wanted[normalise_uuid(uuid)]))
        if not self.devices:
            return
        self.event_set = self._q(getattr(lib, "nvmlEventSetCreate", _missing))
        for dev in self.devices:
            if self.event_set is None:
                break
            for kind in (EVENT_XID_CRITICAL, EVENT_DOUBLE_BIT_ECC):
                if self._q(lib.nvmlDeviceRegisterEvents, dev.handle, kind,
                           self.event_set, ok=True):
                    dev.events |= kind
        if self.event_set is not None and not any(d.events for d in self.devices):
            self._q(lib.nvmlEventSetFree, self.event_set)
            self.event_set = None
        self.poll()                        # the baseline: nothing is news yet

    def mode(self) -> str:
        """How the devices are watched, for `status`: "nvml events+polling", or
        "nvml polling" where no event could be registered."""
        return "nvml events+polling" if self.event_set is not None else "nvml polling"

    def close(self) -> None:
        """Free the event set; a step still waiting on it (a stop abandoned its thread)
        frees it when its wait ends."""
        with self._lock:
            self._closing = True
            if self._busy:
                return
        self._free()

    def _free(self) -> None:
        if self.event_set is not None:
            self._q(self.lib.nvmlEventSetFree, self.event_set)
            self.event_set = None

    # ---- hearing ------------------------------------------------------------------------------
    def step(self, timeout_ms: int = WAIT_MS) -> list[Incident]:
        """What happened since the last step: events (waited on for up to `timeout_ms`; a
        sleep as long where there is no event set), and the counters when POLL_S passed."""
        with self._lock:
            if self._closing:
                return []
            self._busy = True
        try:
            return self._step(timeout_ms)
        finally:
            with self._lock:
                self._busy = False
                closing = self._closing
            if closing:
                self._free()

    def _step(self, timeout_ms: int) -> list[Incident]:
        found = self.wait(timeout_ms) if self.event_set is not None else []
        if self.event_set is None:
            time.sleep(timeout_ms / 1000)
        now = self.clock()
        if self._polled_at is None or now - self._polled_at >= self.poll_s:
            found += self.poll()
        return found

    def wait(self, timeout_ms: int) -> list[Incident]:
        lib = self.lib
        wait = getattr(lib, "nvmlEventSetWait_v2", None) or lib.nvmlEventSetWait
        try:
            data = wait(self.event_set, timeout_ms)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) != _ERROR_TIMEOUT:
                log.debug("NVML event wait: %s", exc)
                time.sleep(timeout_ms / 1000)    # never a busy loop on a broken set
            return []
        uuid = self._uuid_of(data.device)
        if uuid is None:
            return []
        if data.eventType & EVENT_XID_CRITICAL:
            return [Incident(uuid, XID, xid=int(data.eventData))]
        if data.eventType & EVENT_DOUBLE_BIT_ECC:
            return [Incident(uuid, ECC_DOUBLE)]
        return []

    def _uuid_of(self, handle: Any) -> str | None:
        text = _text(self._q(self.lib.nvmlDeviceGetUUID, handle))
        if text is None:
            return None
        return self.wanted.get(normalise_uuid(text))

    def poll(self) -> list[Incident]:
        """The counters NVML has no event for (and double-bit ECC where its event is not
        registered): an incident for each that grew or became pending since last time."""
        self._polled_at = self.clock()
        lib, found = self.lib, []
        for dev in self.devices:
            if not dev.events & EVENT_DOUBLE_BIT_ECC:
                count = self._q(lib.nvmlDeviceGetTotalEccErrors, dev.handle, _UNCORRECTED,
                                _VOLATILE)
                if count is not None:
                    if dev.ecc_double is not None and count > dev.ecc_double:
                        found.append(Incident(dev.uuid, ECC_DOUBLE))
                    dev.ecc_double = int(count)
            retired = self._q(getattr(lib, "nvmlDeviceGetRetiredPagesPendingStatus", _missing),
                              dev.handle)
            rows = self._q(getattr(lib, "nvmlDeviceGetRemappedRows", _missing), dev.handle)
            remap = None if rows is None else bool(rows[2])
            retired = None if retired is None else bool(retired)
            if (remap and dev.remap_pending is False) or \
                    (retired and dev.retired_pending is False):
                found.append(Incident(dev.uuid, REMAP_PENDING))
            dev.remap_pending = remap if remap is not None else dev.remap_pending
            dev.retired_pending = retired if retired is not None else dev.retired_pending
        return found

    def _q(self, fn, *args, ok: bool = False):
        """One NVML call; None (False with `ok`) for any NVML error; with `ok`, True when it
        answered."""
        try:
            result = fn(*args)
        except (self.lib.NVMLError, _NotThere) as exc:
            log.debug("NVML %s: %s", getattr(fn, "__name__", fn), exc)
            return False if ok else None
        return True if ok else result


def _missing(*_args):
    """A function this driver's NVML lacks: read as NotSupported."""
    raise _NotThere


class _NotThere(Exception):
    pass


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
