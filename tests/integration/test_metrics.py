"""`gpumemctl metrics` (gpumemctl/metrics.py, docs/metrics.md): the Prometheus text format,
parsed with prometheus_client's own parser, and its numbers against `status --json`."""
from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slabs_off   # per-allocation keeper deposits and descriptors

MiB = 1 << 20


def scrape(daemon, *args: str, check: int = 0) -> dict:
    """{family name: family}; every family has HELP and TYPE."""
    proc = daemon.cli("metrics", *args, check=check)
    text = proc.stdout.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, f in families.items():
        assert name.startswith("gpumemd_"), name
        assert f"# HELP {f.samples[0].name} " in text or f"# HELP {name} " in text
        assert f.type in ("gauge", "counter"), (name, f.type)
        assert f.documentation, name
    return families


def value(families: dict, name: str, **labels) -> float:
    family = families[name.removesuffix("_total")]
    found = [s.value for s in family.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, family.samples)
    return found[0]


def test_metrics_match_status(daemon):
    daemon.cli("create", "m/a", "--size", "3M", "--durable", check=True)
    daemon.cli("create", "m/b", "--size", "1M", "--ecc", "none", check=True)
    daemon.cli("create", "c", "--size", "5M", "--durable", check=True)
    daemon.cli("mkdir", "-p", "empty/dir", check=True)
    daemon.cli("scrub", "--wait", check=True)
    families = scrape(daemon)
    status = daemon.cli_json("status")
    t, k = status["totals"], status["keeper"]

    assert value(families, "gpumemd_up") == 1
    assert value(families, "gpumemd_allocations", state="ready") == t["by_state"]["ready"] == 3
    assert value(families, "gpumemd_allocations", state="lost") == 0
    assert sum(s.value for s in families["gpumemd_allocations"].samples) == t["allocations"]
    assert value(families, "gpumemd_allocations_durable") == t["durable"] == 2
    assert value(families, "gpumemd_allocations_size_bytes") == t["size"] == 9 * MiB
    assert value(families, "gpumemd_allocations_capacity_bytes") == t["capacity"] == 12 * MiB
    assert value(families, "gpumemd_directories") == t["directories"] == 3
    assert value(families, "gpumemd_holders") == t["holders"]
    assert value(families, "gpumemd_keeper_fds") == k["fds"] == 4     # data + parity, twice
    assert value(families, "gpumemd_keeper_allocations") == k["held"] == 2
    assert value(families, "gpumemd_keeper_up", kind="process") == 1
    for dev in status["devices"]:
        labels = {"device": dev["uuid"], "index": str(dev["index"])}
        assert value(families, "gpumemd_device_memory_total_bytes", **labels) == dev["total"]
        assert value(families, "gpumemd_device_memory_ours_bytes", **labels) == dev["ours"]
        assert value(families, "gpumemd_device_memory_free_bytes", **labels) == dev["free"]
    # The host backend has no NVML figures: no sample is made up for them.
    assert not any(name.startswith("gpumemd_device_temperature") for name in families)

    last = status["scrub"]["last"]
    assert value(families, "gpumemd_scrub_running") == 0
    assert value(families, "gpumemd_scrub_runs_total") == 1
    assert value(families, "gpumemd_scrub_blocks_total") == last["totals"]["blocks"] > 0
    assert value(families, "gpumemd_scrub_last_finish_timestamp_seconds") == \
        last["finished_ns"] / 1e9
    assert value(families, "gpumemd_uptime_seconds") > 0
    assert families["gpumemd_scrub_runs"].type == "counter"

    daemon.cli("scrub", "--wait", check=True)              # counters only go up
    assert value(scrape(daemon), "gpumemd_scrub_runs_total") == 2


def test_metrics_json(daemon):
    daemon.cli("create", "x", "--size", "1M", check=True)
    families = {f["name"]: f for f in json.loads(daemon.cli("metrics", "--json",
                                                            check=True).stdout)}
    assert families["gpumemd_up"]["samples"] == [{"labels": {}, "value": 1}]
    assert families["gpumemd_allocations_capacity_bytes"]["samples"][0]["value"] == 2 * MiB


def test_metrics_when_the_daemon_is_down(daemon_factory):
    d = daemon_factory(start=False)
    proc = d.cli("metrics", check=3)
    families = list(text_string_to_metric_families(proc.stdout.decode()))
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [("gpumemd_up", [0])]
    assert proc.stderr.decode().count("\n") == 1 and "not running" in proc.stderr.decode()
    d.start()
    assert value(scrape(d), "gpumemd_up") == 1
    d.stop()
    assert b"gpumemd_up 0\n" in d.cli("metrics", check=3).stdout
