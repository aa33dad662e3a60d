"""`gpumemctl top` and `gpumemctl metrics` on a real GPU (pytest -m gpu on the GPU machine):
the devices panel shows NVML telemetry and our allocation's share of the memory bar, a
verify from the monitor runs with progress on the CUDA codec, and the metrics' device
figures equal `status --json`."""
from __future__ import annotations

import os

import pytest

from tests.tui.driving import live_app, notifications, run_app, table_rows, until

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def gpu_daemon(daemon_factory):
    return daemon_factory(backend="cuda")


def test_top_shows_nvml_and_verifies_on_the_gpu(gpu_daemon, tmp_path):
    d = gpu_daemon
    d.cli("create", "models/llama", "--size", "1G", "--durable", "--device", "0", check=True)
    d.cli("write", "models/llama", input=os.urandom(64 * MiB), check=True)
    app = live_app(d)
    shot = os.path.join(os.environ.get("OUT", str(tmp_path)), "top-cuda.svg")

    async def scenario(pilot):
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.devices,
                    timeout=20, what="a snapshot with devices")
        dev = app.snapshot.devices[0]
        assert dev["telemetry"] == "nvml" and dev["ours"] >= 1 << 30
        panel = str(app.main.query_one("#devices").render())
        assert dev["name"] in panel and "util " in panel and "°C" in panel
        assert "ours 1G" in panel or "ours 1.1G" in panel          # capacity + parity
        await until(pilot, lambda: "models/" in table_rows(app))
        await pilot.press("enter")
        await until(pilot, lambda: table_rows(app) == ["llama"])
        await pilot.press("v")
        await until(pilot, lambda: any(n.startswith("clean:") for n in notifications(app)),
                    timeout=60, what="the verify result")
        await until(pilot, lambda: app.snapshot.by_path["models/llama"]["verified"])
        app.save_screenshot(os.path.basename(shot), os.path.dirname(shot))
        print(f"devices panel: {panel}")
    run_app(app, scenario, size=(140, 40))
    assert os.path.exists(shot)


def test_metrics_device_figures_match_status(gpu_daemon):
    d = gpu_daemon
    d.cli("create", "m/x", "--size", "256M", check=True)
    status = d.cli_json("status")
    text = d.cli("metrics", check=True).stdout.decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    for dev in status["devices"]:
        labels = f'{{device="{dev["uuid"]}",index="{dev["index"]}"}}'
        assert values[f"gpumemd_device_memory_total_bytes{labels}"] == dev["total"]
        assert values[f"gpumemd_device_memory_ours_bytes{labels}"] == dev["ours"]
        assert values[f"gpumemd_device_nvml_memory_total_bytes{labels}"] == \
            dev["memory_total"]
        assert f"gpumemd_device_temperature_celsius{labels}" in values
    print("\n".join(line for line in text.splitlines() if line.startswith("gpumemd_device")))
