"""The devices panel's text from NVML fields (as the H100 machine reported them): the memory
split, alarms, and one line a device on servers with many GPUs."""
from __future__ import annotations

from tui.widgets.devices import COMPACT_FROM, compact_line, device_line, memory_split

GiB = 1 << 30


def h100(index=0, **kw):
    d = {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3",
         "total": 85017493504, "free": 84177780736, "ours": 1207959552,
         "telemetry": "nvml", "memory_total": 80 * GiB, "memory_used": 3 * GiB,
         "memory_free": 77 * GiB, "utilization_gpu": 7, "temperature_c": 38, "power_w": 120.4,
         "power_limit_w": 700.0, "ecc_enabled": True, "ecc_volatile_corrected": 0,
         "ecc_volatile_uncorrected": 0, "remapped_correctable": 0,
         "remapped_uncorrectable": 0, "remapped_pending": False, "remapped_failure": False}
    d.update(kw)
    return d


def test_memory_split_uses_nvml_and_counts_others():
    total, ours, others, free = memory_split(h100())
    assert total == 80 * GiB and ours == 1207959552
    assert others == 3 * GiB - 1207959552 and free == 77 * GiB


def test_memory_split_without_nvml_uses_the_backend():
    d = {"index": 0, "name": "host memory (memfd)", "total": 8 * GiB, "free": 6 * GiB,
         "ours": 2 * GiB, "telemetry": "unavailable: the host backend has no GPU"}
    assert memory_split(d) == (8 * GiB, 2 * GiB, 0, 6 * GiB)
    assert "the host backend has no GPU" in device_line(d).plain


def test_two_line_device_with_alarms():
    text = device_line(h100(ecc_volatile_uncorrected=2, remapped_pending=True)).plain
    memory, telemetry = text.split("\n")
    assert "ours 1.1G" in memory and "NVIDIA H100 80GB HBM3" in memory
    assert "util 7%" in telemetry and "38°C" in telemetry and "120/700W" in telemetry
    assert "uncorr 2" in telemetry and "PENDING" in telemetry


def test_many_gpus_get_one_line_each():
    lines = [compact_line(h100(i)) for i in range(8)]
    assert COMPACT_FROM <= 8 and all("\n" not in line.plain for line in lines)
    assert lines[3].plain.startswith("3 ") and "7% 38°C 120W" in lines[3].plain
    assert "ALERT" in compact_line(h100(remapped_failure=True)).plain
    assert "ALERT" not in lines[0].plain


def test_slabs_and_parity_arenas_are_shown_where_there_are_any():
    plain = device_line(h100()).plain
    assert "slabs" not in plain and "parity" not in plain
    d = h100(slabs={"count": 2, "bytes": 6 << 20, "used_bytes": 5 << 20,
                    "slack_bytes": 1 << 20},
             parity_arenas={"count": 3, "bytes": 10 << 20, "used_bytes": 8 << 20,
                            "spans": 64})
    memory = device_line(d).plain.split("\n")[0]
    assert "slabs 5M/6M slack 1M" in memory and "parity 8M/10M" in memory
