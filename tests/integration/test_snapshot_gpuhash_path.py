"""The cuda backend's snapshot data path with the block checksums computed on the GPU
(gpumemctl/snapshots/devpath.py, staging.py), on the fake CUDA driver with the kernel run
under its CPU emulation (gpuhash_emu/): a snapshot made so verifies on the CPU path and
restores byte for byte, one made on the CPU path restores through it, an incremental one
writes only what changed, and a flipped byte in a stored block is found after the copy to
the device, zeroed there and named."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from tests import fakecuda
from tests.harness import ROOT
from tests.integration import xxh3_emu
from tests.snapstore import MiB, lose_memory, make_store, read_manifest

UNCORRECTABLE = 8
STAND_IN = os.path.join(ROOT, "tests", "integration", "gpuhash_emu")


@pytest.fixture
def gpu_hash_daemon(fake_lib, daemon_factory, tmp_path):
    lib = xxh3_emu.build(str(tmp_path))
    if lib is None:
        pytest.skip("no C++20 compiler to build the kernel's emulation")
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib))
    d.hash_env = {**fakecuda.env(fake_lib), "GPUMEMCTL_SNAPSHOT_HASH": "gpu",
                  "GPUMEMCTL_SNAPSHOT_IO": "staged", "XXH3_EMU_LIB": lib,
                  "GPUMEMCTL_SNAPSHOT_STAGING": "2,3",     # 2 MiB x 3: the ring wraps often
                  "PYTHONPATH": STAND_IN + os.pathsep + ROOT}
    d.cpu_env = {**fakecuda.env(fake_lib), "GPUMEMCTL_SNAPSHOT_HASH": "cpu"}
    return d


def _cli(d, *args, env, check=True):
    return d.cli(*args, env=env, check=check, timeout=240)


def _json(d, *args, env):
    return json.loads(_cli(d, *args, "--json", env=env).stdout)


def _sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _flip(store: str, snapshot: str, block: int) -> None:
    """Flip one byte of `block` where the snapshot's manifest says it is stored."""
    entry = read_manifest(store, snapshot)["allocations"][0]
    for first, count, key, off in entry["extents"]:
        if first <= block < first + count:
            with open(os.path.join(store, key), "r+b") as f:
                at = off + (block - first) * MiB + 12345
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x40]))
            return
    raise AssertionError(f"block {block} is in no extent")


def test_gpu_checksums_make_the_same_snapshot_and_restore_it(gpu_hash_daemon, request,
                                                             tmp_path):
    d = gpu_hash_daemon
    size = 24 * MiB + 4097                   # a dozen staging buffers, a short last block
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    _cli(d, "create", "w", "--size", str(size), "--durable", env=d.cpu_env)
    _cli(d, "write", "w", str(tmp_path / "in"), env=d.cpu_env)
    store = make_store(request)
    made = _json(d, "snapshot", "create", store, env=d.hash_env)
    assert (made["checksums"], made["io"], made["bytes_written"]) == ("gpu", "posix", size)
    _cli(d, "snapshot", "verify", store, env=d.cpu_env)      # the CPU's xxhash agrees

    lose_memory(d)
    back = _json(d, "snapshot", "restore", store, env=d.hash_env)
    assert back["checksums"] == "gpu" and back["allocations"][0]["result"] == "ok", back
    assert _sha(_cli(d, "read", "w", env=d.cpu_env).stdout) == _sha(data)

    _json(d, "snapshot", "create", store, "--incremental", env=d.hash_env)
    d.cli("write", "w", "--offset", str(15 * MiB), input=b"x" * 10, env=d.cpu_env, check=True)
    inc = _json(d, "snapshot", "create", store, "--incremental", env=d.hash_env)
    assert (inc["bytes_read"], inc["bytes_written"]) == (MiB, MiB), inc
    _cli(d, "snapshot", "restore", store, "--as", "copy", env=d.hash_env)
    want = data[:15 * MiB] + b"x" * 10 + data[15 * MiB + 10:]
    assert _sha(_cli(d, "read", "copy/w", env=d.cpu_env).stdout) == _sha(want)


def test_a_flipped_stored_byte_is_named_after_the_copy_to_the_device(gpu_hash_daemon,
                                                                     request, tmp_path):
    d = gpu_hash_daemon
    d.allow_errors = True                     # the damage is logged at ERROR, on purpose
    size = 20 * MiB + 100
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    _cli(d, "create", "w", "--size", str(size), "--durable", env=d.cpu_env)
    _cli(d, "write", "w", str(tmp_path / "in"), env=d.cpu_env)
    store = make_store(request)
    made = _json(d, "snapshot", "create", store, env=d.cpu_env)       # the CPU's checksums
    assert made["checksums"] == "cpu"
    _flip(store, made["snapshot"], 13)
    proc = _cli(d, "snapshot", "restore", store, "--as", "copy", "--json", env=d.hash_env,
                check=UNCORRECTABLE)
    back = json.loads(proc.stdout)
    assert back["checksums"] == "gpu" and back["damaged"] == 1, back
    assert back["allocations"][0]["damaged"] == [[13 * MiB, 14 * MiB]], back
    info = json.loads(_cli(d, "info", "copy/w", "--json", env=d.cpu_env).stdout)
    assert info["state"] == "degraded" and info["damaged"], info


def test_one_command_grows_its_buffers_from_a_changed_block_to_whole_chunks(
        gpu_hash_daemon, request, tmp_path):
    """The ring is made as large as a copy needs (staging.py, Ring._fit): in one
    `snapshot create --incremental`, the first allocation's one changed block takes two
    buffers of one huge page, and the next allocation, new since the last snapshot, needs
    them grown to whole 4 MiB chunks and a third one; a restore then reads every byte back
    through buffers of the other shape."""
    d = gpu_hash_daemon
    env = {**d.hash_env, "GPUMEMCTL_SNAPSHOT_STAGING": "4,3"}
    first, second = os.urandom(12 * MiB), os.urandom(18 * MiB + 333)
    (tmp_path / "a").write_bytes(first)
    (tmp_path / "b").write_bytes(second)
    _cli(d, "create", "a", "--size", str(len(first)), "--durable", env=d.cpu_env)
    _cli(d, "write", "a", str(tmp_path / "a"), env=d.cpu_env)
    store = make_store(request)
    _json(d, "snapshot", "create", store, env=env)
    d.cli("write", "a", "--offset", str(5 * MiB), input=b"y" * 7, env=d.cpu_env, check=True)
    _cli(d, "create", "b", "--size", str(len(second)), "--durable", env=d.cpu_env)
    _cli(d, "write", "b", str(tmp_path / "b"), env=d.cpu_env)
    inc = _json(d, "snapshot", "create", store, "--incremental", env=env)
    assert inc["bytes_written"] == MiB + len(second), inc

    lose_memory(d)
    back = _json(d, "snapshot", "restore", store, env=env)
    assert [a["result"] for a in back["allocations"]] == ["ok", "ok"], back
    want = first[:5 * MiB] + b"y" * 7 + first[5 * MiB + 7:]
    assert _sha(_cli(d, "read", "a", env=d.cpu_env).stdout) == _sha(want)
    assert _sha(_cli(d, "read", "b", env=d.cpu_env).stdout) == _sha(second)
