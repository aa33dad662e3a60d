"""Snapshots of GPU memory on a real GPU (run on the GPU machine: pytest -m gpu): both data
paths (the pinned staging buffers, and KvikIO where it is installed: cuFile with GPUDirect
Storage, else its compatibility mode), a restore after the memory is lost, incremental
snapshots, and a damaged snapshot block that must never reach GPU memory as data."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os

import pytest

from gpumemctl.protocol import GpumemError
from tests.harness import usable_gpus

pytestmark = pytest.mark.gpu

MiB = 1 << 20
HAVE_KVIKIO = importlib.util.find_spec("kvikio") is not None


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


def paths():
    yield "staged"
    yield pytest.param("kvikio", marks=pytest.mark.skipif(not HAVE_KVIKIO,
                                                          reason="KvikIO is not installed"))


def _json(d, *args, env):
    return json.loads(d.cli(*args, "--json", env=env, check=True, timeout=300).stdout)


def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


@pytest.mark.parametrize("io", list(paths()))
def test_gpu_memory_comes_back_from_a_snapshot_after_it_is_lost(gpu_daemon, tmp_path, io):
    d, env = gpu_daemon, {"GPUMEMCTL_SNAPSHOT_IO": io}
    size = 300 * MiB + 4097
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    d.cli("create", "w", "--size", str(size), "--durable", check=True)
    d.cli("write", "w", str(tmp_path / "in"), check=True, timeout=300)
    store = str(tmp_path / "snaps")
    made = _json(d, "snapshot", "create", store, env=env)
    print(f"\nsnapshot create ({io}): {made['rate'] / 1e9:.2f} GB/s, io {made['io']}")
    assert made["io"] in ("posix", "gds") and made["bytes_written"] == size
    d.stop()
    d.kill_keeper()
    d.start()
    assert d.cli_json("info", "w")["state"] == "lost"
    back = _json(d, "snapshot", "restore", store, env=env)
    print(f"snapshot restore ({io}): {back['rate'] / 1e9:.2f} GB/s, io {back['io']}")
    assert back["allocations"][0]["result"] == "ok"
    assert _sha(d.cli("read", "w", check=True, timeout=300).stdout) == _sha(data)
    assert d.cli_json("check")["clean"]
    # tracking restarts with the next snapshot; then a small write is all that is read
    _json(d, "snapshot", "create", store, "--incremental", env=env)
    d.cli("write", "w", "--offset", str(200 * MiB), input=b"x" * 10, check=True)
    inc = _json(d, "snapshot", "create", store, "--incremental", env=env)
    assert inc["bytes_read"] == MiB and inc["bytes_written"] == MiB
    d.cli("snapshot", "restore", store, "--as", "copy", env=env, check=True, timeout=300)
    want = data[:200 * MiB] + b"x" * 10 + data[200 * MiB + 10:]
    assert _sha(d.cli("read", "copy/w", check=True, timeout=300).stdout) == _sha(want)


@pytest.mark.parametrize("io", list(paths()))
def test_a_damaged_snapshot_block_never_reaches_gpu_memory_as_data(gpu_daemon, tmp_path, io):
    d, env = gpu_daemon, {"GPUMEMCTL_SNAPSHOT_IO": io}
    d.allow_errors = True             # the damage is logged at ERROR, as it should be
    size = 64 * MiB
    data = os.urandom(size)
    d.cli("create", "w", "--size", str(size), "--durable", check=True)
    d.cli("write", "w", input=data, check=True, timeout=300)
    store = tmp_path / "snaps"
    made = _json(d, "snapshot", "create", str(store), env=env)
    manifest = json.loads((store / made["snapshot"] / "manifest.json").read_bytes())
    first, _count, key, off = next(e for e in manifest["allocations"][0]["extents"]
                                   if e[0] <= 10 < e[0] + e[1])      # block 10's place
    with open(store / key, "r+b") as f:
        f.seek(off + (10 - first) * MiB + 5)
        f.write(b"\xff" if data[10 * MiB + 5] != 0xff else b"\x00")
    assert d.cli("snapshot", "verify", str(store), env=env).returncode == 8
    proc = d.cli("snapshot", "restore", str(store), "--as", "r", env=env, timeout=300)
    assert proc.returncode == 8, proc.stderr
    info = d.cli_json("info", "r/w")
    assert info["state"] == "degraded" and info["damaged"] == [[10 * MiB, 11 * MiB]]
    # a damaged allocation gives out no mapping: the rest is read by copy, 4 MiB a request
    assert d.cli("read", "r/w", "--offset", str(10 * MiB), "--length", "4096").returncode == 8
    with d.client() as c:
        with pytest.raises(GpumemError) as bad:
            c.read_copy("r/w", 10 * MiB + 4096, 4096)
        assert bad.value.code == 8
        def copy(start: int, end: int) -> bytes:
            return b"".join(c.read_copy("r/w", at, min(4 * MiB, end - at))
                            for at in range(start, end, 4 * MiB))
        assert copy(0, 10 * MiB) == data[:10 * MiB]
        assert copy(11 * MiB, size) == data[11 * MiB:]
