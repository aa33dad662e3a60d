"""GPU health mapped onto allocations (issue 28), end to end on the host backend: incidents
injected with `gpumemctl debug gpu-event` (gpumemd --enable-fault-injection) take the path an
NVML event takes (daemon/services/health.py): the device's health in status, devices and
metrics, a `gpu_health` event naming the allocations on the device, a verify of them at
once, and XID 79 (fallen off the bus) marking them lost for a snapshot to restore. The NVML
side is tests/unit/test_gpu_health.py's (a fake NVML)."""
from __future__ import annotations

import json
import shutil
import tempfile
import time

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.harness import store_random as make
from tests.users import NOBODY, run_as

PERMISSION = 6


@pytest.fixture
def health_daemon(daemon_factory):
    return daemon_factory(extra_args=["--enable-fault-injection", "--host-capacity", "512M"])


def gpu_event(d, *args: str, check=True) -> dict:
    return json.loads(d.cli("debug", "gpu-event", "--device", "0", *args, "--json",
                            check=check).stdout)


def health_events(d, action: str = "incident") -> list[dict]:
    return [e for e in d.cli_json("events", "--limit", "1000")
            if e["kind"] == "gpu_health" and e["detail"].get("action") == action]


def wait_for(predicate, timeout: float = 15.0):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_double_bit_ecc_names_the_allocations_verifies_them_and_degrades(health_daemon):
    d = health_daemon
    make(d, "a")
    make(d, "b", durable=False)
    before = {n: d.cli_json("info", n)["verified"] for n in ("a", "b")}
    [dev] = d.cli_json("devices")
    assert dev["health"]["state"] == "ok" and dev["health"]["monitor"] == "injection only"

    answer = gpu_event(d, "--ecc", "double")
    assert answer["cause"] == "ecc_double" and answer["state"] == "degraded"
    assert answer["allocations"] == 2 and answer["verifying"] == 2 and answer["lost"] == 0

    # the events: one everyone sees (the count), one for root naming its allocations
    incidents = health_events(d)
    shared = [e for e in incidents if e["uid"] is None]
    named = [e for e in incidents if e["uid"] == 0]
    assert shared[0]["detail"]["allocations"] == 2 and "paths" not in shared[0]["detail"]
    assert shared[0]["detail"]["device"] == dev["uuid"] and shared[0]["detail"]["index"] == 0
    assert sorted(named[0]["detail"]["paths"]) == ["a", "b"]
    assert named[0]["detail"]["cause"] == "ecc_double"

    # a verify of both, at once (not the scrub's: none runs)
    verified = wait_for(lambda: health_events(d, "verified"))
    assert verified[0]["detail"]["verified"] == 2 and verified[0]["detail"]["failed"] == 0
    for n in ("a", "b"):
        assert d.cli_json("info", n)["verified"] not in (None, before[n])
    assert d.cli_json("status")["scrub"]["state"] == "idle"

    status_dev = d.cli_json("status")["devices"][0]
    for shown in (status_dev, d.cli_json("devices")[0]):
        h = shown["health"]
        assert h["state"] == "degraded" and h["cause"] == "ecc_double" and h["at"]
        assert h["counts"] == {"xid": 0, "ecc_double": 1, "remap_pending": 0}
    assert "health degraded (ecc_double)" in d.cli("status", check=True).stdout.decode()
    table = d.cli("devices", check=True).stdout.decode()
    assert "HEALTH" in table and "degraded (ecc_double)" in table

    metrics = d.cli("metrics", check=True).stdout.decode()
    labels = f'device="{dev["uuid"]}",index="0"'
    assert f'gpumemd_device_health{{{labels},state="degraded"}} 1' in metrics
    assert f'gpumemd_device_health{{{labels},state="ok"}} 0' in metrics
    assert f'gpumemd_device_health_events_total{{{labels},cause="ecc_double"}} 1' in metrics


def test_remap_pending_degrades_too(health_daemon):
    d = health_daemon
    make(d, "a")
    answer = gpu_event(d, "--remap")
    assert answer["cause"] == "remap_pending" and answer["state"] == "degraded"
    assert wait_for(lambda: health_events(d, "verified"))


def test_non_critical_xid_is_only_recorded(health_daemon):
    d = health_daemon
    make(d, "a")
    answer = gpu_event(d, "--xid", "13")
    assert answer["state"] == "ok" and answer["allocations"] == 0 and answer["lost"] == 0
    [event] = health_events(d)
    assert event["detail"]["xid"] == 13 and event["uid"] is None
    h = d.cli_json("devices")[0]["health"]
    assert h["state"] == "ok" and h["counts"]["xid"] == 1
    assert d.cli_json("info", "a")["state"] == "ready"
    time.sleep(0.5)
    assert not health_events(d, "verified")


def test_fallen_off_the_bus_marks_lost_and_a_snapshot_restores(health_daemon, request):
    d = health_daemon
    store = tempfile.mkdtemp(prefix="gpumem-health-")
    request.addfinalizer(lambda: shutil.rmtree(store, ignore_errors=True))
    data = {"a": make(d, "a"), "b": make(d, "b", size=64 << 10)}    # b: in a slab
    d.cli("snapshot", "create", store, "--quiet", check=True)

    answer = gpu_event(d, "--xid", "79")
    assert answer["state"] == "lost" and answer["lost"] == 2
    for n in ("a", "b"):
        assert d.cli_json("info", n)["state"] == "lost"
    assert d.cli("read", "a").returncode != 0
    lost = [e for e in d.cli_json("events", "--limit", "1000") if e["kind"] == "lost"]
    assert {e["path"] for e in lost} == {"a", "b"}
    assert "fell off the bus" in lost[0]["detail"]["reason"]
    assert d.cli_json("devices")[0]["health"]["state"] == "lost"
    assert "lost (xid 79)" in d.cli("devices", check=True).stdout.decode()

    d.cli("snapshot", "restore", store, "--lost-only", "--quiet", check=True)
    for n, content in data.items():
        assert d.cli_json("info", n)["state"] == "ready"
        assert d.cli("read", n, check=True).stdout == content
    assert d.cli_json("check")["clean"] is True


def _as_other(sock: str) -> dict:
    with Client(sock, timeout=20) as c:
        c.create("mine", 1 << 20)
        out = {}
        try:
            c.debug_gpu_event(0, ecc="double")
            out["inject"] = "allowed"
        except GpumemError as exc:
            out["inject"] = exc.code
        return out


def _events_of_other(sock: str) -> list[dict]:
    with Client(sock, timeout=20) as c:
        return [e for e in c.events(limit=1000) if e["kind"] == "gpu_health"]


def test_another_uid_cannot_inject_and_sees_only_its_own_allocations(health_daemon):
    d = health_daemon
    make(d, "rootfile")
    assert run_as(_as_other, d.socket) == {"inject": PERMISSION}
    gpu_event(d, "--ecc", "double")
    seen = run_as(_events_of_other, d.socket)
    incidents = [e for e in seen if e["detail"]["action"] == "incident"]
    assert {e["uid"] for e in incidents} == {None, NOBODY}
    everyone = next(e for e in incidents if e["uid"] is None)
    assert everyone["detail"]["allocations"] == 2 and "paths" not in everyone["detail"]
    own = next(e for e in incidents if e["uid"] == NOBODY)
    assert own["detail"]["paths"] == ["mine"] and own["detail"]["allocations"] == 1
    assert "rootfile" not in json.dumps(seen)
    # root sees both owners' names
    named = {p for e in health_events(d) for p in e["detail"].get("paths", [])}
    assert named == {"rootfile", "mine"}


def test_refused_without_fault_injection(daemon):
    out = daemon.cli("debug", "gpu-event", "--device", "0", "--ecc", "double", check=PERMISSION)
    assert b"--enable-fault-injection" in out.stderr
    daemon.cli("debug", "gpu-event", "--device", "7", "--xid", "48", check=PERMISSION)
