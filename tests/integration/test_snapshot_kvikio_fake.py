"""The KvikIO data path of snapshots (gpumemctl/snapshots/gds.py) on the fake CUDA driver,
with a stand-in for KvikIO (tests/fakekvikio): the store hands KvikIO only files it opened
itself by directory descriptor, as /proc/self/fd paths (issue 24: a store's names may be
swapped; KvikIO opens by path), and the data and its checks still come out right."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests import fakecuda
from tests.harness import ROOT
from tests.snapstore import MiB, lose_memory, make_store

FAKE_KVIKIO = os.path.join(ROOT, "tests", "fakekvikio")
UNCORRECTABLE = 8


@pytest.fixture
def kvikio_daemon(fake_lib, daemon_factory, tmp_path):
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib))
    d.kvikio_log = str(tmp_path / "kvikio.log")
    d.kvikio_env = {**fakecuda.env(fake_lib), "GPUMEMCTL_SNAPSHOT_IO": "kvikio",
                    "PYTHONPATH": ROOT + os.pathsep + FAKE_KVIKIO,
                    "FAKE_KVIKIO_LOG": d.kvikio_log}
    return d


def _cli(d, *args, check=True):
    return d.cli(*args, env=d.kvikio_env, check=check, timeout=120)


def _json(d, *args):
    return json.loads(_cli(d, *args, "--json").stdout)


def _opened(d) -> list[str]:
    with open(d.kvikio_log) as f:
        return [line.split()[0] for line in f]


def test_kvikio_path_writes_and_reads_only_files_the_store_opened(kvikio_daemon, request,
                                                                  tmp_path):
    d = kvikio_daemon
    size = 40 * MiB + 4097
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    _cli(d, "create", "w", "--size", str(size), "--durable")
    _cli(d, "write", "w", str(tmp_path / "in"))
    store = make_store(request)
    made = _json(d, "snapshot", "create", store)
    assert (made["io"], made["bytes_written"]) == ("posix", size), made
    written = _opened(d)
    assert written and all(p.startswith("/proc/self/fd/") for p in written), written
    (obj,) = os.listdir(os.path.join(store, made["snapshot"], "data"))
    assert obj == "0.bin"                                      # committed: renamed in place

    lose_memory(d)
    back = _json(d, "snapshot", "restore", store)
    assert back["allocations"][0]["result"] == "ok", back
    read = _opened(d)[len(written):]
    assert read and all(p.startswith("/proc/self/fd/") for p in read), read
    out = _cli(d, "read", "w").stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()

    # A flipped byte found by the device-to-host check: that block is damaged, not data.
    path = os.path.join(store, made["snapshot"], "data", obj)
    with open(path, "r+b") as f:
        f.seek(5 * MiB + 3)
        byte = f.read(1)
        f.seek(5 * MiB + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    d.allow_errors = True                     # the damage is logged at ERROR, on purpose
    proc = _cli(d, "snapshot", "restore", store, "--as", "copy", check=UNCORRECTABLE)
    assert "'copy/w' is degraded" in proc.stderr.decode(), proc.stderr
    info = json.loads(_cli(d, "info", "copy/w", "--json").stdout)
    assert info["state"] == "degraded" and info["damaged"], info
