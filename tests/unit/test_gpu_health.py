"""GPU health's NVML side without a GPU (issue 28): daemon/services/gpuevents.py driven by a
fake NVML (pynvml's own error classes), with events and where events are unsupported
(polling), and daemon/services/health.py acting on what it hears, on the unit tier's daemon
(tests/unit/world.py). What NVML does on a real GPU is tests/gpu's (docs/telemetry.md)."""
from __future__ import annotations

import threading
import types

import pynvml
import pytest
import trio

from daemon.services import gpuevents
from daemon.services.gpuevents import ECC_DOUBLE, REMAP_PENDING, XID, Incident, NvmlWatcher
from daemon.services.health import HealthMonitor
from daemon.verbs.plan import run_sync
from tests.sizes import MiB

from .world import ROOT, World, clean

UUID = "GPU-8f6a1c2e-0000-1111-2222-333344445555"


class FakeNvml:
    """A pynvml look-alike: device 0 (UUID) and device 1 (another GPU); `events` False makes
    nvmlDeviceRegisterEvents raise NotSupported, `event_set` False leaves out
    nvmlEventSetCreate (an old driver). Counters and queued events are set by the test."""

    NVMLError = pynvml.NVMLError

    def __init__(self, *, events: bool = True, event_set: bool = True, uuid: str = UUID):
        self.uuids = [uuid, "GPU-other"]
        self.dbe = [0, 0]
        self.remap_pending = [False, False]
        self.retired_pending = [0, 0]
        self.queued: list = []
        self.registered: list = []
        self.freed = 0
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.block = False
        self.events = events
        if event_set:
            self.nvmlEventSetCreate = lambda: "set"

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h[1]].encode()

    def nvmlDeviceRegisterEvents(self, h, kind, event_set):
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append((h[1], kind))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if self.block:
            self.waiting.set()
            self.release.wait(5)
        if not self.queued:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, kind, data = self.queued.pop(0)
        return types.SimpleNamespace(device=("handle", index), eventType=kind, eventData=data)

    def nvmlEventSetFree(self, event_set):
        self.freed += 1

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert (kind, counter) == (1, 0)           # uncorrected, volatile
        return self.dbe[h[1]]

    def nvmlDeviceGetRemappedRows(self, h):
        return (0, 0, self.remap_pending[h[1]], False)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self.retired_pending[h[1]]


def watcher(lib, **kw) -> NvmlWatcher:
    w = NvmlWatcher(lib, [UUID.lower()], poll_s=0, **kw)
    w.open()
    return w


def test_events_registered_and_heard_for_the_backends_devices_only():
    lib = FakeNvml()
    w = watcher(lib)
    assert w.mode() == "nvml events+polling"
    assert lib.registered == [(0, gpuevents.EVENT_XID_CRITICAL),
                              (0, gpuevents.EVENT_DOUBLE_BIT_ECC)]    # not GPU-other
    assert w.step(timeout_ms=1) == []                                  # a timeout
    lib.queued = [(0, gpuevents.EVENT_XID_CRITICAL, 79)]
    [inc] = w.step(timeout_ms=1)
    assert inc == Incident(UUID.lower(), XID, xid=79) and inc.lost and inc.critical
    lib.queued = [(0, gpuevents.EVENT_DOUBLE_BIT_ECC, 0)]
    assert w.step(timeout_ms=1) == [Incident(UUID.lower(), ECC_DOUBLE)]
    lib.queued = [(1, gpuevents.EVENT_XID_CRITICAL, 48)]                # not ours
    assert w.step(timeout_ms=1) == []
    # double-bit ECC has its event: the count is not polled as well (no double incident)
    lib.dbe[0] = 3
    assert w.step(timeout_ms=1) == []
    w.close()
    assert lib.freed == 1


def test_critical_and_non_critical_xids():
    assert Incident(UUID, XID, xid=48).critical and not Incident(UUID, XID, xid=48).lost
    assert not Incident(UUID, XID, xid=13).critical
    assert Incident(UUID, ECC_DOUBLE).critical and Incident(UUID, REMAP_PENDING).critical


@pytest.mark.parametrize("kind", ["unsupported", "no event set"])
def test_where_events_are_unsupported_the_counters_are_polled(kind, monkeypatch):
    monkeypatch.setattr(gpuevents.time, "sleep", lambda s: None)
    lib = FakeNvml(events=False) if kind == "unsupported" else FakeNvml(event_set=False)
    lib.dbe[0], lib.remap_pending[0] = 2, False         # what was there before: no news
    w = watcher(lib)
    assert w.mode() == "nvml polling" and w.event_set is None
    assert lib.freed == (1 if kind == "unsupported" else 0)
    assert w.step() == []
    lib.dbe[0] = 3
    assert w.step() == [Incident(UUID.lower(), ECC_DOUBLE)]
    assert w.step() == []                               # counted once
    lib.remap_pending[0] = True
    assert w.step() == [Incident(UUID.lower(), REMAP_PENDING)]
    assert w.step() == []                               # still pending: not news again
    lib.retired_pending[0] = 1
    assert w.step() == [Incident(UUID.lower(), REMAP_PENDING)]
    lib.dbe[1] = 9                                      # another GPU's
    assert w.step() == []


def test_polling_waits_for_its_interval():
    lib = FakeNvml(events=True)
    now = [0.0]
    w = NvmlWatcher(lib, [UUID], poll_s=5, clock=lambda: now[0])
    w.open()
    lib.remap_pending[0] = True
    assert w.step(timeout_ms=1) == []                   # 0 s after the baseline
    now[0] = 5.0
    assert w.step(timeout_ms=1) == [Incident(UUID, REMAP_PENDING)]


def test_a_stop_during_a_wait_frees_the_set_after_the_wait():
    lib = FakeNvml()
    w = watcher(lib)
    lib.block = True
    thread = threading.Thread(target=w.step, args=(1000,))
    thread.start()
    assert lib.waiting.wait(5)
    w.close()
    assert lib.freed == 0                               # never under a running wait
    lib.release.set()
    thread.join(5)
    assert lib.freed == 1 and w.event_set is None
    assert w.step() == []                               # closed: nothing more


def test_no_nvml_device_of_the_backend_watches_nothing():
    lib = FakeNvml(uuid="GPU-somewhere-else")
    w = watcher(lib)
    assert w.devices == [] and w.event_set is None


def test_monitor_acts_on_what_nvml_reports(tmp_path, monkeypatch):
    """The monitor's NVML path on the unit tier's daemon: a polled double-bit ECC error on
    its device degrades it, records gpu_health naming the allocation, and verifies it."""
    monkeypatch.setattr(gpuevents.time, "sleep", lambda s: None)
    world = World(tmp_path)
    m = world.m
    run_sync(m.names.create("x", ROOT, size=MiB))
    [dev] = m.reports.devices()
    lib = FakeNvml(events=False, uuid=dev.uuid)
    monitor = HealthMonitor(m.verbs, lib=lib, poll_s=0)

    async def scenario():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(monitor._watch)
            nursery.start_soon(monitor._verifier)
            while monitor.monitor != "nvml polling":
                await trio.sleep(0.01)
            lib.dbe[0] = 1
            with trio.fail_after(10):
                while not [e for e in m.reports.events(since=0, limit=1000)[0]
                           if e["kind"] == "gpu_health"
                           and e["detail"]["action"] == "verified"]:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(scenario)
    assert monitor.health_of(dev.uuid)["state"] == "degraded"
    assert monitor.health_of(dev.uuid)["counts"][ECC_DOUBLE] == 1
    events = [e for e in m.reports.events(since=0, limit=1000)[0] if e["kind"] == "gpu_health"]
    named = [e for e in events if e["uid"] == 0]
    assert named[0]["detail"]["paths"] == ["x"] and named[0]["detail"]["injected"] is False
    assert m.queries.lookup_allocation("x", ROOT).verified_ns is not None
    clean(m)
