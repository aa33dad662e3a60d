"""The one wrapper for NVML (package nvidia-ml-py, module `pynvml`). Nothing else imports it.

- Lazy, thread-safe init: the library is loaded and `nvmlInit` called on the first query, once.
  A failure (no driver, no libnvidia-ml.so, version mismatch) is remembered: every later query
  answers "unavailable: <reason>" at once instead of retrying the loader on every request. A
  driver installed while the daemon runs is seen after a restart.
- Typed results: one `GpuSnapshot` per device. Each field is queried on its own, and any field
  NVML cannot answer (NotSupported on a consumer board, NoPermission, GpuIsLost, a function an
  old driver lacks) is None, which the CLI shows as n/a. A query never raises.
- A short cache (`CACHE_S`): `status` and `devices` from many clients, or the TUI's refresh,
  cost at most one round of driver calls per second. The lock is held while a snapshot is
  taken, so concurrent callers share one refresh rather than each hitting the driver.
- NVML calls can block for a long time (a GPU falling off the bus, nvmlInit on a machine
  without persistence mode: up to seconds), so the daemon calls `snapshot()` through
  `trio.to_thread.run_sync`: the socket server never waits on the driver.
- NVML numbers devices by PCI bus id and ignores CUDA_VISIBLE_DEVICES; the backend's index is
  CUDA's. Devices are therefore matched by UUID (`GPU-...`), never by index; `nvml_index` is
  NVML's own number. A MIG instance (CUDA UUID `MIG-...`) has no match and shows as unavailable.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpumemd")

CACHE_S = 1.0

# NVML enum values (nvml.h); kept here so the module imports without pynvml installed.
_TEMPERATURE_GPU = 0
_ERROR_CORRECTED, _ERROR_UNCORRECTED = 0, 1
_COUNTER_VOLATILE, _COUNTER_AGGREGATE = 0, 1


@dataclasses.dataclass(frozen=True)
class GpuSnapshot:
    """One device as NVML saw it at `telemetry_at`. None: NVML could not say."""
    nvml_index: int
    uuid: str
    name: str | None = None
    memory_total: int | None = None          # bytes, as NVML counts them (all processes)
    memory_used: int | None = None
    memory_free: int | None = None
    utilization_gpu: int | None = None       # percent of the last sample period
    utilization_memory: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None             # current draw
    power_limit_w: float | None = None       # enforced limit
    ecc_enabled: bool | None = None          # ECC mode now
    ecc_enabled_pending: bool | None = None  # ECC mode after the next reset
    ecc_volatile_corrected: int | None = None     # since the last driver load
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None    # lifetime (infoROM)
    ecc_aggregate_uncorrected: int | None = None
    remapped_correctable: int | None = None       # rows remapped for correctable errors
    remapped_uncorrectable: int | None = None     # ... for uncorrectable errors
    remapped_pending: bool | None = None          # a remap waits for the next GPU reset
    remapped_failure: bool | None = None          # a remap failed: the GPU needs service
    pcie_gen: int | None = None              # current link (drops at idle to save power)
    pcie_width: int | None = None
    pcie_gen_max: int | None = None          # best the GPU and the slot can do
    pcie_width_max: int | None = None
    telemetry_at: float = 0.0                # time.time() of the sample

    def telemetry(self) -> dict:
        """The fields merged into a `devices`/`status` entry."""
        fields = dataclasses.asdict(self)
        del fields["uuid"], fields["name"]    # the backend's own name and UUID stay
        return fields


# Every telemetry key with None: the shape of an entry when NVML has nothing to say, so that
# `devices --json` has the same keys on every backend.
EMPTY_TELEMETRY: dict = {f.name: None for f in dataclasses.fields(GpuSnapshot)
                         if f.name not in ("uuid", "name")}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """All devices at one moment, or the reason there are none."""
    devices: tuple[GpuSnapshot, ...] = ()
    unavailable: str | None = None           # None when NVML answered
    driver_version: str | None = None

    def for_uuid(self, uuid: str) -> GpuSnapshot | None:
        key = normalise_uuid(uuid)
        return next((d for d in self.devices if normalise_uuid(d.uuid) == key), None)

    def fields_for(self, uuid: str) -> dict:
        """The telemetry keys for the backend device `uuid`, plus `telemetry`: "nvml" or
        "unavailable: <reason>"."""
        if self.unavailable:
            return {**EMPTY_TELEMETRY, "telemetry": f"unavailable: {self.unavailable}"}
        snap = self.for_uuid(uuid)
        if snap is None:
            return {**EMPTY_TELEMETRY,
                    "telemetry": f"unavailable: NVML does not list a device with UUID {uuid}"}
        return {**snap.telemetry(), "telemetry": "nvml"}


def normalise_uuid(uuid: str) -> str:
    """`GPU-8f6a...` from NVML and from the CUDA backend compare equal whatever the case."""
    text = uuid.strip().lower()
    return text if text.startswith(("gpu-", "mig-")) else "gpu-" + text


def unavailable_fields(reason: str) -> dict:
    return {**EMPTY_TELEMETRY, "telemetry": f"unavailable: {reason}"}


class Nvml:
    """Thread-safe access to NVML. `lib` is the pynvml module (a stand-in in tests)."""

    def __init__(self, lib: Any = None, cache_s: float = CACHE_S):
        self._lib = lib
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._ready = False
        self._failure: str | None = None
        self._cached: Snapshot | None = None
        self._cached_at = 0.0

    # ---- init -------------------------------------------------------------------------------
    def _init(self) -> str | None:
        """Load and initialise NVML once; the failure reason, or None. Call with the lock."""
        if self._ready or self._failure:
            return self._failure
        try:
            if self._lib is None:
                import pynvml  # the only import of pynvml in the project
                self._lib = pynvml
            self._lib.nvmlInit()
            self._ready = True
        except ImportError as exc:
            self._failure = f"nvidia-ml-py is not installed ({exc})"
        except Exception as exc:   # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded..
            self._failure = _no_driver_reason(exc)
        if self._failure:
            log.info("GPU telemetry unavailable: %s", self._failure)
        return self._failure

    def unavailable(self) -> str | None:
        """Why NVML cannot answer (None when it can). Initialises on first call."""
        with self._lock:
            return self._init()

    def library(self) -> tuple[Any, str | None]:
        """The initialised pynvml module and None, or None and why not (the GPU health
        watcher's, daemon/services/gpuevents.py, which calls it from its own thread)."""
        with self._lock:
            failure = self._init()
            return (None, failure) if failure else (self._lib, None)

    def shutdown(self) -> None:
        with self._lock:
            if self._ready:
                self._query(self._lib.nvmlShutdown)
            self._ready, self._cached = False, None

    # ---- queries ----------------------------------------------------------------------------
    def snapshot(self, max_age: float | None = None) -> Snapshot:
        """Every device, from the cache when it is younger than `max_age` (default CACHE_S).
        Never raises; blocks while the driver answers (call it off the event loop)."""
        max_age = self._cache_s if max_age is None else max_age
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached_at < max_age:
                return self._cached
            failure = self._init()
            if failure:
                snap = Snapshot(unavailable=failure)
            else:
                snap = self._take()
            self._cached, self._cached_at = snap, time.monotonic()
            return snap

    def _take(self) -> Snapshot:
        lib = self._lib
        count = self._query(lib.nvmlDeviceGetCount)
        if count is None:
            return Snapshot(unavailable="NVML cannot count the devices")
        devices = []
        for index in range(count):
            handle = self._query(lib.nvmlDeviceGetHandleByIndex, index)
            uuid = None if handle is None else _text(self._query(lib.nvmlDeviceGetUUID, handle))
            if uuid is None:            # no permission for this device (cgroup), or lost
                continue
            devices.append(self._device(index, handle, uuid))
        return Snapshot(devices=tuple(devices),
                        driver_version=_text(self._query(lib.nvmlSystemGetDriverVersion)))

    def _device(self, index: int, h, uuid: str) -> GpuSnapshot:
        lib, q = self._lib, self._query
        mem = q(lib.nvmlDeviceGetMemoryInfo, h)
        util = q(lib.nvmlDeviceGetUtilizationRates, h)
        ecc = q(lib.nvmlDeviceGetEccMode, h)
        rows = q(lib.nvmlDeviceGetRemappedRows, h)
        power = q(lib.nvmlDeviceGetPowerUsage, h)
        limit = q(lib.nvmlDeviceGetEnforcedPowerLimit, h)

        def ecc_count(kind: int, counter: int):
            return q(lib.nvmlDeviceGetTotalEccErrors, h, kind, counter)
        return GpuSnapshot(
            nvml_index=index, uuid=uuid, name=_text(q(lib.nvmlDeviceGetName, h)),
            memory_total=_attr(mem, "total"), memory_used=_attr(mem, "used"),
            memory_free=_attr(mem, "free"),
            utilization_gpu=_attr(util, "gpu"), utilization_memory=_attr(util, "memory"),
            temperature_c=q(lib.nvmlDeviceGetTemperature, h, _TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000,
            power_limit_w=None if limit is None else limit / 1000,
            ecc_enabled=None if ecc is None else bool(ecc[0]),
            ecc_enabled_pending=None if ecc is None else bool(ecc[1]),
            ecc_volatile_corrected=ecc_count(_ERROR_CORRECTED, _COUNTER_VOLATILE),
            ecc_volatile_uncorrected=ecc_count(_ERROR_UNCORRECTED, _COUNTER_VOLATILE),
            ecc_aggregate_corrected=ecc_count(_ERROR_CORRECTED, _COUNTER_AGGREGATE),
            ecc_aggregate_uncorrected=ecc_count(_ERROR_UNCORRECTED, _COUNTER_AGGREGATE),
            remapped_correctable=None if rows is None else int(rows[0]),
            remapped_uncorrectable=None if rows is None else int(rows[1]),
            remapped_pending=None if rows is None else bool(rows[2]),
            remapped_failure=None if rows is None else bool(rows[3]),
            pcie_gen=q(lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_width=q(lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            pcie_gen_max=q(lib.nvmlDeviceGetMaxPcieLinkGeneration, h),
            pcie_width_max=q(lib.nvmlDeviceGetMaxPcieLinkWidth, h),
            telemetry_at=time.time())

    def _query(self, fn: Callable, *args):
        """One NVML call; None for any NVML error (NotSupported, NoPermission, GpuIsLost,
        FunctionNotFound on an old driver...). Other exceptions are bugs and propagate."""
        try:
            return fn(*args)
        except self._lib.NVMLError as exc:
            log.debug("NVML %s%r: %s", getattr(fn, "__name__", fn), args[1:], exc)
            return None


def _no_driver_reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "Library Not Found" in text or "Driver Not Loaded" in text:
        return f"no NVIDIA driver (NVML: {text})"
    return f"NVML failed to initialise: {text}"


def _attr(obj, name: str):
    return None if obj is None else int(getattr(obj, name))


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_default: Nvml | None = None
_default_lock = threading.Lock()


def default() -> Nvml:
    """The process-wide NVML wrapper (created on first use; pynvml imported on first query)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Nvml()
        return _default


def snapshot(max_age: float | None = None) -> Snapshot:
    return default().snapshot(max_age)
