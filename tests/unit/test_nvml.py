"""daemon/services/nvml.py without a GPU: NVML's own error classes drive a stand-in library,
so every path a real driver can take (no driver, a field not supported, a device lost) is
exercised on a CPU machine. What is asserted is what `devices` would show, never which calls
were made."""
from __future__ import annotations

import threading
import types

import pynvml
import pytest

from daemon.services import nvml

UUID = "GPU-8f6a1c2e-0000-1111-2222-333344445555"


def nvml_error(code: int) -> Exception:
    return pynvml.NVMLError(code)     # pynvml maps the code to its subclass


def fake_lib(*, init_error: int | None = None, unsupported=(), devices=1, lost_index=None):
    """A pynvml look-alike for an H100-like board; `unsupported` names functions that raise
    NotSupported."""
    calls = {"init": 0}

    def maybe(name, value):
        def fn(*args):
            if name in unsupported:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return value(*args) if callable(value) else value
        fn.__name__ = name
        return fn

    def init():
        calls["init"] += 1
        if init_error is not None:
            raise nvml_error(init_error)

    def handle(index):
        if index == lost_index:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index

    lib = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: devices, nvmlDeviceGetHandleByIndex=handle,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlDeviceGetUUID=lambda h: UUID[:-1] + str(h),
        nvmlDeviceGetName=maybe("nvmlDeviceGetName", "NVIDIA H100 80GB HBM3"),
        nvmlDeviceGetMemoryInfo=maybe("nvmlDeviceGetMemoryInfo", types.SimpleNamespace(
            total=80 << 30, used=1 << 30, free=79 << 30)),
        nvmlDeviceGetUtilizationRates=maybe("nvmlDeviceGetUtilizationRates",
                                            types.SimpleNamespace(gpu=7, memory=3)),
        nvmlDeviceGetTemperature=maybe("nvmlDeviceGetTemperature", 33),
        nvmlDeviceGetPowerUsage=maybe("nvmlDeviceGetPowerUsage", 70123),
        nvmlDeviceGetEnforcedPowerLimit=maybe("nvmlDeviceGetEnforcedPowerLimit", 700000),
        nvmlDeviceGetEccMode=maybe("nvmlDeviceGetEccMode", [1, 0]),
        nvmlDeviceGetTotalEccErrors=maybe("nvmlDeviceGetTotalEccErrors",
                                          lambda h, kind, counter: 10 * kind + counter),
        nvmlDeviceGetRemappedRows=maybe("nvmlDeviceGetRemappedRows", (2, 1, 0, 0)),
        nvmlDeviceGetCurrPcieLinkGeneration=maybe("nvmlDeviceGetCurrPcieLinkGeneration", 5),
        nvmlDeviceGetCurrPcieLinkWidth=maybe("nvmlDeviceGetCurrPcieLinkWidth", 16),
        nvmlDeviceGetMaxPcieLinkGeneration=maybe("nvmlDeviceGetMaxPcieLinkGeneration", 5),
        nvmlDeviceGetMaxPcieLinkWidth=maybe("nvmlDeviceGetMaxPcieLinkWidth", 16))
    return lib, calls


def test_no_driver_gives_unavailable_fields_not_an_exception():
    lib, _ = fake_lib(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    snap = nvml.Nvml(lib).snapshot()
    assert snap.devices == ()
    assert snap.unavailable.startswith("no NVIDIA driver")
    fields = snap.fields_for(UUID)
    assert fields["telemetry"].startswith("unavailable: no NVIDIA driver")
    assert set(fields) == set(nvml.EMPTY_TELEMETRY) | {"telemetry"}
    assert all(v is None for k, v in fields.items() if k != "telemetry")


def test_failed_init_is_remembered():
    lib, calls = fake_lib(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    wrapper = nvml.Nvml(lib, cache_s=0)
    for _ in range(3):
        assert "Driver Not Loaded" in wrapper.snapshot().unavailable
    assert calls["init"] == 1


def test_full_snapshot_units_and_matching_by_uuid():
    lib, _ = fake_lib()
    snap = nvml.Nvml(lib).snapshot()
    assert snap.unavailable is None and snap.driver_version == "550.54.15"
    fields = snap.fields_for(UUID[:-1].lower() + "0")      # case does not matter
    assert fields["telemetry"] == "nvml"
    assert fields["memory_total"] == 80 << 30 and fields["memory_used"] == 1 << 30
    assert (fields["utilization_gpu"], fields["temperature_c"]) == (7, 33)
    assert fields["power_w"] == pytest.approx(70.123)
    assert fields["power_limit_w"] == pytest.approx(700)
    assert fields["ecc_enabled"] is True and fields["ecc_enabled_pending"] is False
    assert fields["ecc_volatile_uncorrected"] == 10     # (uncorrected=1, volatile=0)
    assert fields["ecc_aggregate_uncorrected"] == 11
    assert fields["remapped_correctable"] == 2 and fields["remapped_pending"] is False
    assert (fields["pcie_gen"], fields["pcie_width"]) == (5, 16)
    assert snap.fields_for("GPU-not-here")["telemetry"].startswith(
        "unavailable: NVML does not list")


def test_each_unsupported_field_is_none_and_the_rest_stay():
    lib, _ = fake_lib(unsupported={"nvmlDeviceGetRemappedRows", "nvmlDeviceGetEccMode",
                                   "nvmlDeviceGetTotalEccErrors",
                                   "nvmlDeviceGetPowerUsage"})
    fields = nvml.Nvml(lib).snapshot().fields_for(UUID[:-1] + "0")
    for key in ("remapped_pending", "remapped_failure", "ecc_enabled",
                "ecc_volatile_uncorrected", "power_w"):
        assert fields[key] is None, key
    assert fields["temperature_c"] == 33 and fields["pcie_width"] == 16


def test_a_lost_device_is_left_out_and_the_others_answer():
    lib, _ = fake_lib(devices=2, lost_index=0)
    snap = nvml.Nvml(lib).snapshot()
    assert [d.nvml_index for d in snap.devices] == [1]


def test_cache_and_one_init_under_threads():
    lib, calls = fake_lib()
    wrapper = nvml.Nvml(lib, cache_s=60)
    results = []
    threads = [threading.Thread(target=lambda: results.append(wrapper.snapshot()))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls["init"] == 1
    assert all(r is results[0] for r in results)          # one refresh, shared
    assert wrapper.snapshot(max_age=0) is not results[0]  # max_age=0 takes a new one


def test_real_pynvml_on_this_machine_never_raises():
    snap = nvml.Nvml().snapshot()
    if snap.unavailable:            # a CPU machine: the reason, no devices
        assert snap.devices == ()
    else:                           # a GPU machine: every device has a UUID
        assert all(d.uuid for d in snap.devices)


def test_server_merges_telemetry_for_a_gpu_backend_off_the_event_loop():
    """A non-host backend goes through NVML on a worker thread; a device NVML cannot
    describe (no driver here, or a UUID it does not list) keeps every key, with None."""
    import trio

    from daemon.backends import DeviceInfo
    from daemon.server import Server

    dev = DeviceInfo(index=0, uuid="GPU-00000000-0000-0000-0000-00000000beef",
                     name="stand-in GPU", total=8 << 30, free=6 << 30, granularity=2 << 20)
    reports = types.SimpleNamespace(backend_name="cuda", devices=lambda: [dev],
                                    bytes_held_per_device=lambda: {dev.uuid: 4 << 20})
    server = Server(types.SimpleNamespace(reports=reports), "/nonexistent.sock", {})
    [entry] = trio.run(server._devices)
    assert entry["ours"] == 4 << 20 and entry["backend"] == "cuda"
    assert entry["telemetry"].startswith("unavailable: ")
    assert set(entry) >= set(nvml.EMPTY_TELEMETRY)
    assert all(entry[k] is None for k in nvml.EMPTY_TELEMETRY)
