"""The snapshot block-hash kernel on a real GPU (gpumemctl/snapshots/gpuhash.py, xxh3.cu):
bit-identical to the xxhash package's XXH3-128 for every edge size and for random 1 MiB
blocks, so manifests keep their format; and the cuda backend's snapshots with the checksums
from the GPU: created and restored clean, and a flipped stored byte named by the restore."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests.harness import usable_gpus

pytestmark = pytest.mark.gpu
xxhash = pytest.importorskip("xxhash")

MiB = 1 << 20
UNCORRECTABLE = 8
EDGES = [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 127, 128, 129, 160, 161, 239,
         240, 241, 255, 256, 1023, 1024, 1025, 1088, 2049, 4099, 16385, 65537, MiB - 1, MiB]


@pytest.fixture(scope="module")
def hasher():
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    from gpumemctl.snapshots import gpuhash
    h = gpuhash.GpuHasher(0)
    yield h
    h.close()


@pytest.fixture(scope="module")
def scratch(hasher):
    from gpumemctl import cudadrv
    with cudadrv.context(0):
        ptr = cudadrv.mem_alloc(64 * MiB + 4096)
    yield ptr
    with cudadrv.context(0):
        cudadrv.mem_free(ptr)


def _on_gpu(hasher, ptr: int, data: bytes) -> list[str]:
    from gpumemctl import cudadrv
    with cudadrv.context(0):
        if data:
            cudadrv.memcpy_htod(ptr, data, len(data))
    return hasher.hash(ptr, len(data))


def _want(data: bytes) -> list[str]:
    return [xxhash.xxh3_128_hexdigest(data[i:i + MiB]) for i in range(0, len(data), MiB)]


def test_every_edge_size_matches_xxhash(hasher, scratch):
    for n in EDGES:
        data = os.urandom(n)
        assert _on_gpu(hasher, scratch, data) == _want(data), n
    assert _on_gpu(hasher, scratch, b"") == []


def test_every_size_to_2100_bytes_matches_xxhash(hasher, scratch):
    for n in range(1, 2100):
        data = os.urandom(n)
        assert _on_gpu(hasher, scratch, data) == _want(data), n


def test_64_mib_of_random_blocks_and_a_short_last_one_match_xxhash(hasher, scratch):
    for size in (64 * MiB, 63 * MiB + 12345, 5 * MiB + 17):
        data = os.urandom(size)
        assert _on_gpu(hasher, scratch, data) == _want(data), size
    zeros = bytes(3 * MiB)
    assert _on_gpu(hasher, scratch, zeros) == _want(zeros)
    # 8-byte aligned but not 16: a slab's allocation may start anywhere a granule allows
    data = os.urandom(2 * MiB + 3)
    assert _on_gpu(hasher, scratch + 8, data) == _want(data)



def test_ranges_hashed_in_one_wait_match_xxhash_range_by_range(hasher, scratch):
    """hash_ranges (an incremental snapshot's changed runs): each range's checksums land in
    their own slots of the result, ranges of one and of many blocks, an empty one between."""
    from gpumemctl import cudadrv
    data = os.urandom(40 * MiB + 777)
    with cudadrv.context(0):
        cudadrv.memcpy_htod(scratch, data, len(data))
    ranges = [(3 * MiB, MiB), (10 * MiB, 5 * MiB + 8), (20 * MiB, 0), (0, 17),
              (39 * MiB, MiB + 777), (1 * MiB, 2 * MiB)]
    got = hasher.hash_ranges([(scratch + at, n) for at, n in ranges])
    assert got == [_want(data[at:at + n]) for at, n in ranges]
    assert hasher.hash_ranges([]) == []


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


GPU = {"GPUMEMCTL_SNAPSHOT_HASH": "gpu", "GPUMEMCTL_SNAPSHOT_IO": "staged"}


def _json(d, *args, env=GPU, check=True):
    return json.loads(d.cli(*args, "--json", env=env, check=check, timeout=300).stdout)


def test_a_snapshot_hashed_on_the_gpu_restores_clean_and_verifies(gpu_daemon, tmp_path):
    d = gpu_daemon
    size = 300 * MiB + 4097
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    d.cli("create", "w", "--size", str(size), "--durable", check=True)
    d.cli("write", "w", str(tmp_path / "in"), check=True, timeout=300)
    store = str(tmp_path / "snaps")
    made = _json(d, "snapshot", "create", store)
    print(f"\nsnapshot create (gpu checksums): {made['rate'] / 1e9:.2f} GB/s")
    assert (made["checksums"], made["bytes_written"]) == ("gpu", size), made
    d.cli("snapshot", "verify", store, env={"GPUMEMCTL_SNAPSHOT_HASH": "cpu"}, check=True,
          timeout=300)                                       # xxhash on the CPU agrees
    d.stop()
    d.kill_keeper()
    d.start()
    back = _json(d, "snapshot", "restore", store)
    print(f"snapshot restore (gpu checksums): {back['rate'] / 1e9:.2f} GB/s")
    assert back["checksums"] == "gpu" and back["allocations"][0]["result"] == "ok", back
    out = d.cli("read", "w", check=True, timeout=300).stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
    assert d.cli_json("check")["clean"]


def test_a_flipped_stored_byte_is_named_by_a_gpu_checked_restore(gpu_daemon, tmp_path):
    d = gpu_daemon
    d.allow_errors = True             # the damage is logged at ERROR, as it should be
    size = 64 * MiB + 100
    (tmp_path / "in").write_bytes(os.urandom(size))
    d.cli("create", "w", "--size", str(size), "--durable", check=True)
    d.cli("write", "w", str(tmp_path / "in"), check=True, timeout=300)
    store = str(tmp_path / "snaps")
    made = _json(d, "snapshot", "create", store)
    path = os.path.join(store, made["snapshot"], "manifest.json")
    with open(path) as f:
        entry = json.load(f)["allocations"][0]
    first, _n, key, off = next(e for e in entry["extents"] if e[0] <= 21 < e[0] + e[1])
    with open(os.path.join(store, key), "r+b") as f:
        at = off + (21 - first) * MiB + 777
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    back = _json(d, "snapshot", "restore", store, "--as", "copy", check=UNCORRECTABLE)
    assert back["checksums"] == "gpu" and back["damaged"] == 1, back
    assert back["allocations"][0]["damaged"] == [[21 * MiB, 22 * MiB]], back
    info = d.cli_json("info", "copy/w")
    assert info["state"] == "degraded" and info["damaged"], info
