"""gpumemctl/metrics.py on a hand-made status (the NVML part, which the host backend never
fills in), checked with prometheus_client's parser."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpumemctl import metrics

GPU = {"index": 0, "uuid": "GPU-1234", "total": 80 << 30, "free": 70 << 30, "ours": 4 << 30,
       "telemetry": "nvml", "memory_used": 9 << 30, "utilization_gpu": 37,
       "temperature_c": 51, "power_w": 123.5, "ecc_enabled": True,
       "ecc_aggregate_uncorrected": 2, "remapped_pending": False, "pcie_gen": None}


def samples(status: dict) -> dict:
    text = metrics.render(metrics.collect(status))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_nvml_fields_where_present():
    got = samples({"devices": [GPU], "daemon": {"version": 'x"y\\z\n'}})
    labels = (("device", "GPU-1234"), ("index", "0"))
    assert got[("gpumemd_device_utilization_gpu_ratio", labels)] == 0.37
    assert got[("gpumemd_device_temperature_celsius", labels)] == 51
    assert got[("gpumemd_device_power_watts", labels)] == 123.5
    assert got[("gpumemd_device_ecc_enabled", labels)] == 1
    assert got[("gpumemd_device_ecc_aggregate_uncorrected_errors_total", labels)] == 2
    assert got[("gpumemd_device_remapped_rows_pending", labels)] == 0
    assert got[("gpumemd_device_nvml_memory_used_bytes", labels)] == 9 << 30
    assert not any(name == "gpumemd_device_pcie_link_generation" for name, _ in got)  # None
    info = next(k for k in got if k[0] == "gpumemd_info")
    assert dict(info[1])["version"] == 'x"y\\z\n'             # escaped, then read back


def test_memory_held_per_container():
    """status's `containers`: one sample per container, its labels escaped as any."""
    got = samples({"containers": [
        {"runtime": "docker", "id": "ab" * 32, "pod": "", "held_bytes": 6 << 20, "holders": 2},
        {"runtime": "cri", "id": "cd" * 32, "pod": "p-1", "held_bytes": 0, "holders": 1}]})
    docker = (("container", "ab" * 32), ("pod", ""), ("runtime", "docker"))
    cri = (("container", "cd" * 32), ("pod", "p-1"), ("runtime", "cri"))
    assert got[("gpumemd_container_held_bytes", docker)] == 6 << 20
    assert got[("gpumemd_container_held_bytes", cri)] == 0
    assert got[("gpumemd_container_holders", docker)] == 2
    assert not any(k[0].startswith("gpumemd_container") for k in samples({}))
