"""Small allocations packed in slabs (issue 26, docs/storage.md), with config `slabs = true`:
memory and descriptors per object, durability across a kill -9, `check`, and the export
rule (no client, of any uid, ever receives a slab's descriptor)."""
from __future__ import annotations

import ctypes  # noqa: F401 - HostMapping needs it; the other uid cannot import it
import json
import mmap
import os
import resource

import pytest

import gpumemctl.memory  # noqa: F401 - as mmap
from gpumemctl import Client
from tests.harness import wait_for
from tests.users import run_as

KiB, MiB = 1 << 10, 1 << 20


def config_file(tmp_path) -> str:
    path = tmp_path / "gpumemd.toml"
    path.write_text("slabs = true\n")
    return str(path)


@pytest.fixture
def packed(daemon_factory, tmp_path):
    return daemon_factory(extra_args=["--config", config_file(tmp_path),
                                      "--host-capacity", "512M"])


def used(d) -> int:
    dev = d.cli_json("status")["devices"][0]
    return dev["total"] - dev["free"]


def daemon_fds(d) -> int:
    return len(os.listdir(f"/proc/{d.proc.pid}/fd"))


def test_small_durable_objects_cost_their_size_and_survive_a_kill(packed):
    d = packed
    before, fds_before = used(d), daemon_fds(d)
    blobs = {f"kv/{i:04d}": os.urandom(16 * KiB) for i in range(400)}
    with d.client() as c:
        for name, data in blobs.items():
            c.create(name, len(data), durable=True)
    stored = sum(len(b) for b in blobs.values())
    # 400 objects of 16 KiB: slabs of one owner, with 1/16 parity; not 400 x 4 MiB.
    assert used(d) - before <= 1.5 * stored + 4 * MiB, (used(d) - before, stored)
    assert daemon_fds(d) - fds_before <= 16
    # Written by descriptor (the CLI's write): each moves out of its slab first, so that
    # no client ever holds a slab's descriptor (docs/storage.md, "The export rule").
    for name, data in list(blobs.items())[:40]:
        d.cli("write", name, "-", input=data, check=True)
    blobs = {n: (b if i < 40 else bytes(len(b))) for i, (n, b) in enumerate(blobs.items())}
    info = d.cli_json("info", "kv/0399")
    assert info["capacity"] == 16 * KiB and info["durable"]
    d.kill9()
    d.start()
    for name, data in list(blobs.items())[::37]:
        assert d.cli("read", name, check=True).stdout == data
    states = {i["state"] for i in d.cli_json("ls", "-l", "kv")}
    assert states == {"ready"}
    report = json.loads(d.cli("check", "--json", check=0).stdout)
    assert report["clean"], report["problems"]
    assert d.cli("verify", "--all", check=0).returncode == 0


def test_transient_objects_are_dropped_and_their_slots_reused(packed):
    d = packed
    for i in range(50):
        d.cli("create", f"t{i}", "--size", "8K", check=True)
    d.cli("create", "keep", "--size", "8K", "--durable", check=True)
    d.cli("write", "keep", "-", input=b"k" * 8192, check=True)
    slabs = d.cli_json("status")["devices"][0]["slabs"]
    assert (slabs["count"], slabs["objects"], slabs["used_bytes"]) == (1, 51, 51 * 8192)
    assert "slabs: 1 holding 51 small allocations" in d.cli("status", check=True).stdout.decode()
    metrics = d.cli("metrics", check=True).stdout.decode()
    assert any(line.startswith("gpumemd_slab_objects{") and line.endswith(" 51")
               for line in metrics.splitlines())
    d.kill9()
    d.start()
    assert [i["path"] for i in d.cli_json("ls")] == ["keep"]
    assert d.cli("read", "keep", check=True).stdout == b"k" * 8192
    for i in range(50):                                  # the freed slots serve again
        d.cli("create", f"n{i}", "--size", "8K", check=True)
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def _alice_writes(mnt: str, public: str, secret: str) -> int:  # (both in her slab)
    for name, data, mode in (("pub", public, 0o644), ("secret", secret, 0o600)):
        fd = os.open(os.path.join(mnt, "shared", name), os.O_CREAT | os.O_WRONLY, mode)
        os.write(fd, data.encode())
        os.close(fd)
    return 0


def _bob_reads(socket: str) -> list:
    with Client(socket) as c:
        with c.open("shared/pub", "r") as h:
            whole = bytes(h.map) if h.map is not None else h.read()
            return [len(whole), whole.count(b"S"), h.read().decode()]


def test_another_uid_never_receives_a_slab(mounted_factory, tmp_path):
    """alice's world-readable small file, read by bob through a descriptor: it is moved out
    of alice's slab first, so bob's mapping holds that file's bytes and nothing of alice's
    other files, which share the slab (both written through the mount, in place)."""
    # The host backend: its memfds are what a client maps (on cuda a reader gets no fd at
    # all, docs/security.md, and the GPU test of slabs maps a region through CUDA).
    d = mounted_factory(backend="host", extra_args=["--config", config_file(tmp_path)])
    os.mkdir(os.path.join(d.mnt, "shared"), 0o777)
    os.chmod(os.path.join(d.mnt, "shared"), 0o1777)
    public, secret = "P" * 4096, "S" * 4096
    run_as(_alice_writes, d.mnt, public, secret, uid=1000, gid=1000)
    for name in ("pub", "secret"):                                 # both in alice's slab
        assert d.cli_json("info", f"shared/{name}")["capacity"] == 4096
    size, secret_bytes, data = run_as(_bob_reads, d.socket, uid=1001, gid=1001)
    assert data == public and secret_bytes == 0 and size == 2 * MiB
    assert d.cli_json("info", "shared/pub")["capacity"] == 2 * MiB   # memory of its own
    assert d.cli_json("info", "shared/secret")["capacity"] == 4096
    with open(os.path.join(d.mnt, "shared", "secret"), "rb") as f:
        assert f.read() == secret.encode()


def test_many_files_in_the_mount_under_a_low_descriptor_limit(mounted_factory, tmp_path):
    """Issue 26's target: 20,000 files of 4 KiB written into the mount under a 4,096
    descriptor limit all succeed, the daemon holds at most 512 descriptors, and the memory
    held (parity included) is at most 1.5x the bytes stored. (Before slabs each file held 2
    descriptors and 4 MiB: about 1,000 files got through.)"""
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    # The host backend: the target is the CI's. On cuda the first slabs of a kind are
    # small (one granule, doubling), each with its parity rounded up to a granule: 1.87x
    # for these 80 MB on an H100, falling toward 1.08x as objects grow (bench/README.md).
    d = mounted_factory(start=False, backend="host",
                        extra_args=["--config", config_file(tmp_path)])
    d.start(preexec_fn=low_limit)
    before = used(d)
    root = os.path.join(d.mnt, "src")
    os.mkdir(root)
    paths = []
    for i in range(20000):
        path = os.path.join(root, f"d{i // 1000:02d}", f"f{i:05d}")
        if i % 1000 == 0:
            os.mkdir(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(i.to_bytes(4, "little") * 1024)
        paths.append(path)
    wait_for(lambda: daemon_fds(d) <= 512, timeout=10, what="descriptors settle")
    stored = 20000 * 4096
    assert used(d) - before <= 1.5 * stored, (used(d) - before, stored)
    for i in range(0, 20000, 97):
        with open(paths[i], "rb") as f:
            assert f.read() == i.to_bytes(4, "little") * 1024
    assert daemon_fds(d) <= 512


def _durable_batch(socket: str) -> int:
    with Client(socket) as c:
        c.create_many([(f"kv/{i:05d}", 16 * KiB) for i in range(5000)], durable=True,
                      raise_errors=True)
        c.write_many([{"path": f"kv/{i:05d}", "data": i.to_bytes(4, "little") * 4096}
                      for i in range(5000)], raise_errors=True)
    return 0


def test_five_thousand_durable_small_objects_survive_a_kill(packed):
    """Issue 26's target: 5,000 durable 16 KiB objects made through the API (create_many,
    write_many) survive a kill -9 of the daemon, every byte."""
    d = packed
    _durable_batch(d.socket)
    d.kill9()
    d.start()
    with d.client() as c:
        got = c.read_many([f"kv/{i:05d}" for i in range(5000)], raise_errors=True)
    assert all(data == i.to_bytes(4, "little") * 4096 for i, data in enumerate(got))
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def _alice_maps_her_slab(socket: str, name: str) -> list:
    """As a hostile client would: ask for a region and map everything the fd holds."""
    with Client(socket) as c:
        result, fds = c.call_fds("attach", path=name, mode="r", regions=True)
        region = result["info"].get("region")
        span = region["span"] if region else result["info"]["capacity"]
        with mmap.mmap(fds[0], span, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            whole = bytes(m)
        os.close(fds[0])
        c.call("detach", handle=result["handle"])
        return [region is not None, span, whole.count(b"B" * 64)]


def test_the_owner_maps_its_small_object_in_place_and_a_chown_takes_it_out(
        mounted_factory, tmp_path):
    """alice's own open and attach map her packed file where it lies (a region of her
    slab: no move, bytes right both ways). Root gives one of her files to bob: it leaves
    her slab first, so bob's bytes written after never show in her slab's memory."""
    # The host backend: its memfds are what a client maps (on cuda a reader gets no fd at
    # all, docs/security.md, and the GPU test of slabs maps a region through CUDA).
    d = mounted_factory(backend="host", extra_args=["--config", config_file(tmp_path)])
    shared = os.path.join(d.mnt, "shared")
    os.mkdir(shared, 0o1777)
    os.chmod(shared, 0o1777)
    run_as(_alice_writes, d.mnt, "P" * 4096, "S" * 4096, uid=1000, gid=1000)

    def alice_opens() -> list:
        with Client(d.socket) as c:
            with c.open("shared/secret", "rw") as h:
                before = h.read(0, 8)
                h.write(b"s" * 8, 0)
            a = c.attach("shared/secret", "r")
            try:
                mapped = a.read(0, 16)
            finally:
                a.detach()
            return [before.decode(), mapped.decode(), c.info("shared/secret")["capacity"]]
    before, mapped, capacity = run_as(alice_opens, uid=1000, gid=1000)
    assert (before, mapped, capacity) == ("S" * 8, "s" * 8 + "S" * 8, 4096)   # in place
    with open(os.path.join(shared, "secret"), "rb") as f:
        assert f.read() == b"s" * 8 + b"S" * 4088
    os.chown(os.path.join(shared, "secret"), 1001, 1001)          # root gives it to bob
    assert d.cli_json("info", "shared/secret")["capacity"] == 2 * MiB
    with open(os.path.join(shared, "secret"), "r+b") as f:        # bob's bytes from now on
        f.write(b"B" * 4096)
    packed, span, found = run_as(_alice_maps_her_slab, d.socket, "shared/pub", uid=1000,
                                 gid=1000)
    assert packed and span >= 4096 and found == 0
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def test_a_lost_registry_keeps_the_slabs_and_adopt_orphans_gives_their_bytes_back(packed):
    """The registry is gone while the keeper holds slabs: the start refuses (nothing freed),
    and --adopt-orphans re-registers each slab whole under /lost+found/ (which allocation
    had which slot was in the registry), every byte there."""
    from tests.integration.test_startup_safety import (
        REFUSED,
        remove_registry,
        start_refused,
        start_with,
    )
    d = packed
    blobs = {f"s{i}": bytes([65 + i]) * 4096 for i in range(3)}
    with d.client() as c:
        c.create_many([(n, 4096) for n in blobs], durable=True, raise_errors=True)
        c.write_many([(n, b) for n, b in blobs.items()], raise_errors=True)
    d.kill9()
    remove_registry(d)
    status, lines = start_refused(d)
    assert status == REFUSED and len(lines) == 1 and "(it is new)" in lines[0], lines
    start_with(d, "--adopt-orphans")
    found = [e for e in d.cli_json("ls", "-R", "lost+found") if e["type"] == "allocation"]
    assert [e["path"].rsplit("/", 1)[1] for e in found] == ["slab-1"]
    whole = d.cli("read", found[0]["path"], check=True).stdout
    assert all(b in whole for b in blobs.values())


def test_a_reused_slot_reads_as_zeros(packed):
    """A slot an object left holds its bytes until the next tenant: that one must read
    zeros (a create is zero-filled), and the slab's parity must agree with them."""
    d = packed
    with d.client() as c:
        c.create("old", 64 * KiB)
        c.write_many([("old", b"S" * (64 * KiB))], raise_errors=True)
        c.remove("old")
        c.create("new", 64 * KiB)
        assert c.read_many(["new"], raise_errors=True) == [bytes(64 * KiB)]
    assert d.cli("verify", "new", check=0).returncode == 0


def test_removing_an_object_written_in_place_leaves_its_neighbours_verifiable(packed):
    """Two 4 KiB objects share one 128 KiB block's parity. One is written through an
    attachment whose client goes without detaching (the object stays unsealed: its parity
    is stale) and is removed: the block's parity is brought back in line, so the
    neighbour verifies clean, and stays as written."""
    d = packed
    with d.client() as c:
        c.create("a", 4 * KiB)
        c.create("b", 4 * KiB)
        c.write_many([("b", b"b" * (4 * KiB))], raise_errors=True)
        with d.client() as writer:
            writer.attach("a", "rw").write(b"x" * (4 * KiB))
        wait_for(lambda: not c.info("a").get("holders"), what="the writer's session to end")
        assert c.info("a")["unsealed"]
        c.remove("a")
        assert c.read_many(["b"], raise_errors=True) == [b"b" * (4 * KiB)]
    result = d.cli("verify", "b", "--json", check=0)
    assert result.returncode == 0, result.stdout
