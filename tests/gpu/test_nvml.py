"""NVML telemetry and doctor on a real GPU (run on the GPU machine: pytest -m gpu).

The names, UUIDs and memory NVML reports must agree with what CUDA (gpumemctl.cudadrv) says,
`ours` must grow by exactly the capacity of a new allocation, and doctor must find every GPU
check ok."""
from __future__ import annotations

import json
import time

import pytest

from daemon.services import nvml
from tests.sizes import with_parity

pytestmark = pytest.mark.gpu

GPU_CHECKS = ("driver", "cuda")


@pytest.fixture
def cudadrv():
    from gpumemctl import cudadrv
    try:
        cudadrv.device_count()
    except (cudadrv.CudaUnavailable, cudadrv.CudaNoDevice) as exc:
        pytest.skip(f"no CUDA device here: {exc}")
    return cudadrv


@pytest.fixture
def gpu_daemon(cudadrv, daemon_factory):
    return daemon_factory(backend="cuda")


def test_devices_match_cuda(gpu_daemon, cudadrv):
    devs = gpu_daemon.cli_json("devices")
    assert len(devs) == cudadrv.device_count()
    for dev in devs:
        assert dev["backend"] == "cuda"
        assert dev["telemetry"] == "nvml", dev["telemetry"]
        assert nvml.normalise_uuid(dev["uuid"]) == \
            nvml.normalise_uuid(cudadrv.device_uuid(dev["index"]))
        assert dev["name"] == cudadrv.device_name(dev["index"])
        # NVML and CUDA count the same framebuffer (NVML may leave out a reserved part).
        assert dev["memory_total"] == pytest.approx(
            cudadrv.device_total_memory(dev["index"]), rel=0.05)
        assert dev["memory_used"] + dev["memory_free"] <= dev["memory_total"]


def test_every_telemetry_field_is_present_and_typed(gpu_daemon):
    types = {"memory_total": int, "memory_used": int, "memory_free": int,
             "utilization_gpu": int, "utilization_memory": int, "temperature_c": int,
             "power_w": (int, float), "power_limit_w": (int, float), "ecc_enabled": bool,
             "ecc_enabled_pending": bool, "ecc_volatile_corrected": int,
             "ecc_volatile_uncorrected": int, "ecc_aggregate_corrected": int,
             "ecc_aggregate_uncorrected": int, "remapped_correctable": int,
             "remapped_uncorrectable": int, "remapped_pending": bool,
             "remapped_failure": bool, "pcie_gen": int, "pcie_width": int,
             "pcie_gen_max": int, "pcie_width_max": int, "nvml_index": int,
             "telemetry_at": float}
    assert set(types) == set(nvml.EMPTY_TELEMETRY)
    for dev in gpu_daemon.cli_json("devices"):
        for key, kind in types.items():
            assert dev[key] is None or isinstance(dev[key], kind), (key, dev[key])
        for key in ("memory_total", "memory_used", "temperature_c", "nvml_index"):
            assert dev[key] is not None, key       # every data-centre GPU answers these
        if dev["pcie_gen"] is not None:
            assert 1 <= dev["pcie_gen"] <= dev["pcie_gen_max"]
    table = gpu_daemon.cli("devices", check=True).stdout.decode()
    assert "GPU-" in table and "gen" in table


def test_ours_grows_by_the_capacity_and_parity_of_an_allocation(gpu_daemon):
    before = gpu_daemon.cli_json("devices")[0]
    info = gpu_daemon.cli_json("create", "telemetry/probe", "--size", "1G", "--device", "0")
    time.sleep(nvml.CACHE_S + 0.1)                   # past the telemetry cache
    after = gpu_daemon.cli_json("devices")[0]
    assert after["ours"] - before["ours"] == with_parity(info["capacity"])   # ECC parity too
    assert after["memory_used"] - before["memory_used"] >= info["capacity"] * 0.9
    status = gpu_daemon.cli_json("status")
    assert status["devices"][0]["ours"] == after["ours"]
    text = gpu_daemon.cli("status", check=True).stdout.decode()
    assert "util " in text and "PCIe gen" in text


def test_doctor_finds_every_gpu_check_ok(gpu_daemon, cudadrv):
    proc = gpu_daemon.cli("doctor", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == report["exit_status"]
    checks = {c["check"]: c for c in report["checks"]}
    for index in range(cudadrv.device_count()):
        for what in ("vmm", "posix-fd"):
            assert checks[f"device {index} {what}"]["result"] == "ok", checks
        # dma-buf is optional (RDMA only); report it, fail only on a hard error.
        assert checks[f"device {index} dma-buf"]["result"] in ("ok", "warn")
    for name in GPU_CHECKS:
        assert checks[name]["result"] == "ok", checks[name]
    assert checks["socket"]["result"] == "ok" and "backend cuda" in checks["socket"]["message"]
    assert checks["backend"] == {"check": "backend", "result": "ok", "message": "cuda",
                                 "hint": None}
