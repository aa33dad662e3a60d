"""`gpumemctl doctor`, `devices` and `status` against a real gpumemd on the host backend (CPU,
CI), and doctor with no daemon at all. On a machine without an NVIDIA driver, the GPU checks
must come out as warnings with hints, never as a crash."""
from __future__ import annotations

import json
import os

import pytest

from daemon.services import nvml
from tests.sizes import with_parity

MiB = 1 << 20
NO_DRIVER = not os.path.exists("/proc/driver/nvidia/version")
EXIT = {"ok": 0, "warn": 1, "fail": 10}
TELEMETRY_KEYS = set(nvml.EMPTY_TELEMETRY) | {"telemetry"}
BACKEND_KEYS = {"index", "uuid", "name", "total", "free", "granularity", "backend", "ours",
                "slabs", "parity_arenas",   # issue 26 (docs/storage.md)
                "health"}                   # issue 28 (docs/telemetry.md, "GPU health")


def doctor_json(daemon, *args):
    proc = daemon.cli("doctor", "--json", *args)
    report = json.loads(proc.stdout)
    assert proc.returncode == report["exit_status"] == EXIT[report["worst"]]
    return report


def by_name(report: dict) -> dict:
    return {c["check"]: c for c in report["checks"]}


def assert_report_shape(report: dict):
    assert set(report) == {"checks", "worst", "exit_status"}
    worst = max((c["result"] for c in report["checks"]), key=list(EXIT).index)
    assert report["worst"] == worst
    for c in report["checks"]:
        assert set(c) == {"check", "result", "message", "hint"}
        assert c["result"] in EXIT and c["message"]
        assert (c["hint"] is None) == (c["result"] == "ok"), c


def test_doctor_lines_and_exit_status_with_a_daemon(daemon):
    proc = daemon.cli("doctor")
    lines = proc.stdout.decode().splitlines()
    assert lines and all(line.split(" ", 1)[0] in EXIT for line in lines), lines
    worst = max((line.split(" ", 1)[0] for line in lines), key=list(EXIT).index)
    assert proc.returncode == EXIT[worst]
    assert not proc.stderr
    socket_line = next(line for line in lines if line.split()[1] == "socket:")
    assert socket_line.startswith("ok") and "backend host" in socket_line
    assert all("; fix: " in line for line in lines if not line.startswith("ok"))


def test_doctor_json_with_a_daemon(daemon):
    report = doctor_json(daemon)
    assert_report_shape(report)
    checks = by_name(report)
    assert checks["socket"]["result"] == "ok" and daemon.socket in checks["socket"]["message"]
    assert checks["package trio"]["result"] == "ok"
    # The running daemon's own state directory is the one checked (0700, ours).
    assert checks["state directory"]["result"] == "ok"
    assert daemon.state_dir in checks["state directory"]["message"]
    assert checks["backend"]["result"] in ("ok", "warn")


@pytest.mark.skipif(not NO_DRIVER, reason="this machine has an NVIDIA driver")
def test_doctor_without_a_driver_says_so_once_and_passes(daemon):
    """A machine without a GPU is healthy for the host backend (issue 27: it was three
    warnings with one cause, and exit 1): one line says so, the GPU checks are not made."""
    report = doctor_json(daemon)
    checks = by_name(report)
    assert checks["driver"]["result"] == "ok"
    assert "no NVIDIA driver: the host backend will be used" in checks["driver"]["message"]
    assert checks["cuda"]["result"] == "ok" and "not checked" in checks["cuda"]["message"]
    assert checks["devices"]["result"] == "ok"
    assert [c for c in report["checks"] if c["result"] != "ok"] == [], report
    assert report["exit_status"] == 0
    assert checks["backend"] == {"check": "backend", "result": "ok", "hint": None,
                                 "message": "host (memfd): no usable GPU on this machine"}


def test_doctor_without_a_daemon(daemon_factory):
    idle = daemon_factory(start=False)        # its socket is never served
    report = doctor_json(idle, "--state-dir", idle.state_dir)
    assert_report_shape(report)
    sock = by_name(report)["socket"]
    assert sock["result"] == "warn" and "not running" in sock["message"]
    assert f"gpumemd --socket {idle.socket}" in sock["hint"]
    assert report["exit_status"] in (1, 10)   # at least the warning; never 3 (not running)
    assert "backend" not in by_name(report)


def test_doctor_fails_on_a_world_writable_state_directory(daemon_factory):
    idle = daemon_factory(start=False)
    os.makedirs(idle.state_dir)
    os.chmod(idle.state_dir, 0o777)
    proc = idle.cli("doctor", "--state-dir", idle.state_dir, check=10)
    line = next(x for x in proc.stdout.decode().splitlines() if " state directory:" in x)
    assert line.startswith("fail") and f"fix: chmod 0700 {idle.state_dir}" in line


def test_devices_json_on_the_host_backend(daemon):
    devs = daemon.cli_json("devices")
    assert len(devs) == 1
    dev = devs[0]
    assert set(dev) == BACKEND_KEYS | TELEMETRY_KEYS
    assert dev["backend"] == "host" and dev["uuid"].startswith("HOST-")
    assert dev["telemetry"] == "unavailable: the host backend has no GPU"
    assert all(dev[k] is None for k in nvml.EMPTY_TELEMETRY)
    assert dev["ours"] == 0
    daemon.cli("create", "t/a", "--size", "3M", check=True)
    # capacity (2 MiB granules) and the ECC parity region beside it
    assert daemon.cli_json("devices")[0]["ours"] == with_parity(4 * MiB)


def test_status_json_carries_the_same_device_objects(daemon):
    status = daemon.cli_json("status")
    assert status["devices"] == daemon.cli_json("devices")


def test_devices_and_status_text_show_n_a(daemon):
    out = daemon.cli("devices", check=True).stdout.decode().splitlines()
    assert out[0].split() == ["INDEX", "NAME", "UUID", "MEMORY", "OURS", "UTIL", "TEMP",
                              "POWER", "ECC", "UNCORR", "REMAP", "PCIE", "HEALTH"]
    assert out[1].startswith("0") and out[1].count("n/a") == 7
    status = daemon.cli("status", check=True).stdout.decode()
    assert "telemetry unavailable: the host backend has no GPU" in status


def test_nvml_without_a_driver_answers_n_a():
    snap = nvml.Nvml().snapshot()
    if not NO_DRIVER:
        pytest.skip("this machine has an NVIDIA driver (see tests/gpu/test_nvml.py)")
    assert snap.devices == () and snap.unavailable
    fields = snap.fields_for("GPU-00000000-0000-0000-0000-000000000000")
    assert fields["telemetry"] == f"unavailable: {snap.unavailable}"
    assert all(fields[k] is None for k in nvml.EMPTY_TELEMETRY)


# ---- the GPU path on a CPU machine: tests/fakecuda stands in for libcuda.so.1 ----------------
@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> str:
    """A directory holding the fake libcuda.so.1, for LD_LIBRARY_PATH."""
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build tests/fakecuda")
    out = tmp_path_factory.mktemp("fakecuda")
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fakecuda", "fakecuda.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"), source,
                    "-lpthread"], check=True)
    return str(out)


def test_doctor_reads_device_support_through_cuda(daemon_factory, fake_libcuda):
    idle = daemon_factory(start=False)
    env = {"LD_LIBRARY_PATH": fake_libcuda, "FAKECUDA_DEVICES": "2"}
    checks = by_name(json.loads(idle.cli("doctor", "--json", env=env).stdout))
    assert checks["cuda"]["result"] == "ok" and "CUDA driver API" in checks["cuda"]["message"]
    for index in (0, 1):
        for what in ("vmm", "posix-fd", "dma-buf"):
            assert checks[f"device {index} {what}"]["result"] == "ok"
    env.update(FAKECUDA_NO_VMM="1", FAKECUDA_NO_DMABUF="1")
    proc = idle.cli("doctor", "--json", env=env, check=10)
    checks = by_name(json.loads(proc.stdout))
    assert checks["device 0 vmm"]["result"] == "fail" and "--backend host" in \
        checks["device 0 vmm"]["hint"]
    assert checks["device 1 dma-buf"]["result"] == "warn"


def test_devices_on_the_cuda_backend_without_nvml(daemon_factory, fake_libcuda):
    """A cuda backend whose UUIDs NVML cannot describe (no driver here, or fake UUIDs on a
    GPU machine): the answer keeps its shape, every NVML field None, with the reason."""
    gpu = daemon_factory(backend="cuda", env={"LD_LIBRARY_PATH": fake_libcuda,
                                              "FAKECUDA_DEVICES": "2"})
    info = gpu.cli_json("create", "t/a", "--size", "3M", "--device", "1")
    devs = gpu.cli_json("devices")
    assert [d["backend"] for d in devs] == ["cuda", "cuda"]
    assert [d["ours"] for d in devs] == [0, with_parity(info["capacity"])]
    for dev in devs:
        assert set(dev) == BACKEND_KEYS | TELEMETRY_KEYS
        assert dev["telemetry"].startswith("unavailable: ")
        assert all(dev[k] is None for k in nvml.EMPTY_TELEMETRY)
    assert gpu.cli_json("status")["devices"] == devs
    backend = by_name(json.loads(gpu.cli("doctor", "--json", env={
        "LD_LIBRARY_PATH": fake_libcuda}).stdout))["backend"]
    assert backend == {"check": "backend", "result": "ok", "message": "cuda", "hint": None}
