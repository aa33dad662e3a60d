"""Snapshots (`gpumemctl snapshot create|restore|verify|ls|rm`): durable allocations written to a
directory and brought back after their memory is gone, as a user sees it: exit codes, the
bytes read back, states, `info`, `check`, events, and what lies in the store.

"The memory is gone as after a reboot" is simulated as in test_crash.py: the daemon stops,
its keeper is killed, the daemon starts again, and every durable allocation comes back
`lost`. Stores are temporary directories (tempfile.mkdtemp), removed after each test.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile

import pytest
import xxhash  # noqa: F401 - loaded before run_as drops root (tests/users.py): block checksums

import gpumemctl.cli.typerapp  # the typer app: loaded before run_as drops root
import gpumemctl.memory  # noqa: F401 - a handle's mapping, loaded before run_as drops root
from gpumemctl import Client
from gpumemctl.cli import run as cli_run
from gpumemctl.protocol import GpumemError
from gpumemctl.snapshots import (
    engine,  # noqa: F401 - `snapshot` commands load it lazily
    )
from tests.harness import child_env, script_argv, wait_for
from tests.sizes import MiB
from tests.snapstore import lose_memory, states
from tests.users import NOBODY, run_as

KiB = 1 << 10
ECC_BLOCK = 128 * KiB                  # the daemon's damage granularity (docs/ecc.md)
SNAP_RE = re.compile(r"snap-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6}")

USAGE, NOT_FOUND, EXISTS, PERMISSION, UNCORRECTABLE, BUSY, INVALID_STATE = 2, 4, 5, 6, 8, 9, 10

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


# ---- helpers --------------------------------------------------------------------------------
def make_store(request, owner: int | None = None) -> str:
    """An empty store directory, removed after the test; `owner`: chowned to that uid."""
    path = tempfile.mkdtemp(prefix="gpumem-snapstore-")
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def noise(n: int, seed: int | None = None) -> bytes:
    """n random bytes (seeded: fast enough for hundreds of MiB)."""
    if seed is None:
        return os.urandom(n)
    rng = random.Random(seed)
    return b"".join(rng.randbytes(min(16 * MiB, n - at)) for at in range(0, n, 16 * MiB))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fill(d, allocations: dict[str, dict]) -> dict[str, bytes]:
    """Create each {path: {size, mode, ecc, durable}} and fill it with random bytes."""
    data = {}
    with d.client() as c:
        for path, spec in allocations.items():
            c.create(path, spec["size"], durable=spec.get("durable", True),
                     mode=spec.get("mode", 0o644), ecc=spec.get("ecc"))
            data[path] = noise(spec["size"], spec.get("seed"))
            c.write(path, data[path])
    return data


def snapshot_dirs(store: str) -> list[str]:
    return sorted(n for n in os.listdir(store) if SNAP_RE.fullmatch(n))


def manifest_of(store: str, name: str) -> dict:
    with open(os.path.join(store, name, "manifest.json"), "rb") as f:
        return json.loads(f.read())


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def cli_as(sock: str, *args: str) -> dict:
    """`gpumemctl --socket SOCK ARGS` in this process (a run_as child: the venv's interpreter
    cannot be started by another uid): exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_run(["--socket", sock, *args])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def gpumemctl_popen(d, *args: str) -> subprocess.Popen:
    """`gpumemctl --socket S ARGS` started as Daemon.cli starts it, without waiting."""
    return subprocess.Popen(script_argv("gpumemctl") + ["--socket", d.socket, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=child_env())


INFO_KEPT = ("id", "size", "capacity", "mode", "uid", "gid", "durable", "ecc", "unsealed",
             "device")


# ---- 1. round trip after a reboot -------------------------------------------------------------
def test_round_trip_after_memory_is_lost(daemon, request):
    """A user snapshots every durable allocation, loses the memory (reboot), restores: every
    byte, mode, size and ECC setting is back, the allocations are `ready` and durable again,
    `check` is clean and `info` names the snapshot they came from."""
    store = make_store(request)
    specs = {
        "small": {"size": 4096, "mode": 0o640},
        "models/llama/weights": {"size": 5 * MiB + 3, "mode": 0o600},
        "kv/cache": {"size": 3 * MiB, "mode": 0o640, "ecc": "none"},
        "deep/er/nest/ed/tensor": {"size": 2 * MiB + 17, "mode": 0o600},
    }
    data = fill(daemon, specs)
    fill(daemon, {"scratch": {"size": MiB, "durable": False}})     # transient: not snapshotted
    before = {p: daemon.cli_json("info", p) for p in specs}

    made = daemon.cli_json("snapshot", "create", store)
    assert SNAP_RE.fullmatch(made["snapshot"]), made
    location = os.path.join(store, made["snapshot"])
    assert made["location"] == location and made["store"] == store
    assert (made["incremental"], made["parent"], made["io"], made["skipped"]) == \
        (False, None, "posix", [])
    assert {a["path"]: a["size"] for a in made["allocations"]} == \
        {p: s["size"] for p, s in specs.items()}
    assert all(a["durable"] and not a["unsealed"] for a in made["allocations"])
    total = sum(s["size"] for s in specs.values())
    assert made["bytes"] == made["bytes_written"] == made["bytes_read"] == total
    assert snapshot_dirs(store) == [made["snapshot"]]
    assert sorted(os.listdir(location)) == ["data", "manifest.json"]      # no lock left
    assert len(os.listdir(os.path.join(location, "data"))) == len(specs)

    lose_memory(daemon)
    assert states(daemon) == {p: "lost" for p in specs}

    restored = daemon.cli("snapshot", "restore", store, check=True)
    assert b"0 degraded, 0 failed" in restored.stderr and restored.stdout == b"", restored
    with daemon.client() as c:
        for path, expected in data.items():
            assert digest(c.read(path)) == digest(expected), path
            info = c.info(path)
            assert info["state"] == "ready" and info["damaged"] == [], info
            assert {k: info[k] for k in INFO_KEPT} == {k: before[path][k] for k in INFO_KEPT}
            assert info["snapshot"] == location, info
        assert c.check()["clean"], c.check()
        assert {e["path"] for e in c.ls("", recursive=True) if e["type"] == "allocation"} \
            == set(specs)

    # Durable again for real: the keeper holds the restored memory across a daemon crash.
    daemon.kill9()
    daemon.start()
    with daemon.client() as c:
        for path, expected in data.items():
            assert digest(c.read(path)) == digest(expected), path
            assert c.info(path)["state"] == "ready"
        assert c.check()["clean"]


# ---- 2. --as and --force ----------------------------------------------------------------------
def test_restore_as_prefix_and_over_existing(daemon, request):
    """`restore --as PREFIX` makes copies beside the originals; restoring over an allocation
    that is `ready` is refused (exit 5, its data untouched) unless `--force`, which replaces
    only what was named."""
    store = make_store(request)
    specs = {"m/x": {"size": 2 * MiB + 5, "mode": 0o600},
             "m/y": {"size": 4096, "mode": 0o640, "ecc": "none"}}
    saved = fill(daemon, specs)
    before = {p: daemon.cli_json("info", p) for p in specs}
    daemon.cli("snapshot", "create", store, "--quiet", check=True)
    newer = {p: noise(s["size"]) for p, s in specs.items()}
    with daemon.client() as c:
        for path, blob in newer.items():
            c.write(path, blob)

    copies = daemon.cli_json("snapshot", "restore", store, "--as", "restored")
    assert sorted((a["path"], a["from"], a["result"]) for a in copies["allocations"]) == \
        [("restored/m/x", "m/x", "ok"), ("restored/m/y", "m/y", "ok")]
    assert (copies["damaged"], copies["failed"]) == (0, 0)
    with daemon.client() as c:
        for path in specs:
            copy = f"restored/{path}"
            assert c.read(copy) == saved[path], copy
            assert c.read(path) == newer[path], path                  # the original untouched
            info = c.info(copy)
            assert info["id"] != before[path]["id"] and info["state"] == "ready"
            assert (info["size"], info["mode"], info["ecc"], info["durable"]) == \
                (specs[path]["size"], before[path]["mode"], before[path]["ecc"], True)

    refused = daemon.cli("snapshot", "restore", store, check=EXISTS)
    err = refused.stderr.decode()
    assert "'m/x' exists (state ready)" in err and "--force" in err, err
    with daemon.client() as c:
        for path in specs:
            assert c.read(path) == newer[path], path
            assert c.info(path)["state"] == "ready"

    daemon.cli("snapshot", "restore", store, "m/x", "--force", "--quiet", check=True)
    with daemon.client() as c:
        assert c.read("m/x") == saved["m/x"]
        assert c.read("m/y") == newer["m/y"]                          # not named: kept
        info = c.info("m/x")
        assert (info["id"], info["state"], info["durable"]) == (before["m/x"]["id"], "ready",
                                                                True)
        assert c.check()["clean"], c.check()


def test_hard_linked_allocation_is_snapshotted_once(daemon, request):
    """An allocation with two names is stored once; restored `--as` it has both names again
    (one allocation, two links), and refilled in place after a loss both names read it."""
    store = make_store(request)
    data = fill(daemon, {"m/a": {"size": MiB + 9, "mode": 0o600}})["m/a"]
    with daemon.client() as c:
        c.link("m/a", "m/b")
    made = daemon.cli_json("snapshot", "create", store)
    assert [(a["path"], a["size"]) for a in made["allocations"]] == [("m/a", MiB + 9)]
    assert made["bytes_written"] == MiB + 9

    daemon.cli("snapshot", "restore", store, "--as", "copy", "--quiet", check=True)
    with daemon.client() as c:
        info = c.info("copy/m/b")
        assert (info["names"], info["links"]) == (["copy/m/a", "copy/m/b"], 2), info
        assert info["id"] == c.info("copy/m/a")["id"]
        assert c.read("copy/m/b") == data

    lose_memory(daemon)
    daemon.cli("snapshot", "restore", store, "m", "--quiet", check=True)
    with daemon.client() as c:
        assert c.read("m/a") == data and c.read("m/b") == data
        assert c.info("m/b")["links"] == 2 and c.check()["clean"]


def test_user_metadata_comes_back_with_a_restore(daemon, request):
    """An allocation's user metadata (issue 17) is in the manifest and comes back: on a copy
    made `--as`, over an allocation whose metadata changed since (`--force`: the snapshot's,
    all of it), and on one refilled in place after a loss (its own, which the registry
    kept)."""
    store = make_store(request)
    meta = {"index": '{"w": [0, 4096]}', "\udcff": "\udcfe\x00", "empty": ""}
    data = fill(daemon, {"m/a": {"size": MiB + 1, "mode": 0o600}})["m/a"]
    with daemon.client() as c:
        for key, value in meta.items():
            c.meta_set("m/a", key, value)
    made = daemon.cli_json("snapshot", "create", store)
    assert manifest_of(store, made["snapshot"])["allocations"][0]["metadata"] == meta

    daemon.cli("snapshot", "restore", store, "--as", "copy", "--quiet", check=True)
    with daemon.client() as c:
        assert c.info("copy/m/a")["metadata"] == meta and c.read("copy/m/a") == data
        c.meta_set("m/a", "index", "changed")
        c.meta_set("m/a", "added", "since")
    daemon.cli("snapshot", "restore", store, "m/a", "--force", "--quiet", check=True)
    with daemon.client() as c:
        assert c.meta("m/a") == meta
        assert [e["detail"] for e in c.events(path="m/a") if e["kind"] == "meta"][-1] == \
            {"action": "replace", "keys": 3}

    lose_memory(daemon)
    daemon.cli("snapshot", "restore", store, "m/a", "--quiet", check=True)
    with daemon.client() as c:
        assert c.meta("m/a") == meta and c.read("m/a") == data
        assert c.check()["clean"]


def test_create_skips_an_allocation_a_writer_holds(daemon, request):
    """`snapshot create` while another client writes one allocation: that one is skipped
    with a warning naming it and the writer, the others are snapshotted, exit 9."""
    store = make_store(request)
    data = fill(daemon, {"busy": {"size": MiB}, "calm": {"size": 2 * MiB}})
    with daemon.client() as c, c.open("busy", "rw"):
        made = daemon.cli("snapshot", "create", store, "--json", check=BUSY)
    err = made.stderr.decode()
    assert "skipped 'busy'" in err and "locked" in err, err
    result = json.loads(made.stdout)
    assert [a["path"] for a in result["allocations"]] == ["calm"]
    assert [(s["path"], s["reason"]) for s in result["skipped"]] == [("busy", "busy")]
    daemon.cli("snapshot", "restore", store, "--as", "copy", "--quiet", check=True)
    with daemon.client() as c:
        assert c.read("copy/calm") == data["calm"]
        assert [e["path"] for e in c.ls("copy")] == ["copy/calm"]
    events = [e["detail"] for e in daemon.cli_json("events") if e["kind"] == "snapshot"]
    assert events[0]["action"] == "create" and events[0]["result"] == "partial", events


# ---- 3. incremental ---------------------------------------------------------------------------
def test_incremental_writes_and_reads_only_changed_blocks(daemon, request):
    """After a full snapshot of 64 MiB, a few bytes written into 2 of its 64 blocks make an
    incremental snapshot read and write exactly those 2 MiB; it restores byte-identically
    (its other blocks come from the full one). After a daemon restart the changes are not
    known: the incremental reads everything but still writes only the changed block."""
    store = make_store(request)
    size = 64 * MiB
    current = bytearray(fill(daemon, {"big": {"size": size, "seed": 3}})["big"])
    full = daemon.cli_json("snapshot", "create", store, "big")
    assert full["bytes"] == full["bytes_written"] == full["bytes_read"] == size

    with daemon.client() as c:
        for block, offset in ((3, 1234), (40, MiB - 7)):
            at = block * MiB + offset
            patch = noise(5)
            c.write("big", patch, at)
            current[at:at + len(patch)] = patch
    inc = daemon.cli_json("snapshot", "create", store, "big", "--incremental")
    assert (inc["incremental"], inc["parent"]) == (True, full["snapshot"])
    assert inc["bytes"] == size
    assert inc["bytes_written"] == 2 * MiB, inc
    assert inc["bytes_read"] == 2 * MiB, inc
    rows = {r["snapshot"]: r for r in daemon.cli_json("snapshot", "ls", store)}
    assert rows[inc["snapshot"]]["parent"] == full["snapshot"]
    assert rows[inc["snapshot"]]["bytes_written"] == 2 * MiB
    data_dir = os.path.join(store, inc["snapshot"], "data")
    assert sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir)) \
        == 2 * MiB

    daemon.cli("snapshot", "restore", store, "--as", "inc", "--quiet", check=True)
    daemon.cli("snapshot", "restore", os.path.join(store, full["snapshot"]), "--as", "full",
               "--quiet", check=True)
    with daemon.client() as c:
        assert digest(c.read("inc/big")) == digest(bytes(current))
        original = noise(size, 3)
        assert digest(c.read("full/big")) == digest(original)
        assert digest(c.read("big")) == digest(bytes(current))

    daemon.stop()                       # a clean restart: the memory stays, the tracking not
    daemon.start()
    with daemon.client() as c:
        at = 10 * MiB + 99
        c.write("big", b"after restart", at)
        current[at:at + 13] = b"after restart"
    again = daemon.cli_json("snapshot", "create", store, "big", "--incremental")
    assert (again["incremental"], again["parent"]) == (True, inc["snapshot"])
    assert again["bytes_read"] == size, again                        # nothing known: all read
    assert again["bytes_written"] == MiB, again                      # one block differs
    daemon.cli("snapshot", "restore", store, "--as", "again", "--quiet", check=True)
    with daemon.client() as c:
        assert digest(c.read("again/big")) == digest(bytes(current))
        assert c.check()["clean"]
    daemon.cli("snapshot", "verify", store, "--quiet", check=True)


# ---- 4. damage in a store ---------------------------------------------------------------------
def test_damaged_block_and_damaged_manifest(daemon, request):
    """A flipped byte in a snapshot's data: `verify` exits 8 naming the allocation; a restore
    exits 8 and the allocation is `degraded`, the 1 MiB block holding the byte is recorded
    as damaged and reads fail there, while every other byte is right. A flipped byte in the
    manifest: `verify` exits 8 naming the manifest, a restore exits 8 and makes nothing."""
    daemon.allow_errors = True           # damage beyond repair is logged at ERROR, on purpose
    store = make_store(request)
    specs = {"w/d": {"size": 3 * MiB + 100, "mode": 0o600}, "w/ok": {"size": 4096}}
    data = fill(daemon, specs)
    name = daemon.cli_json("snapshot", "create", store)["snapshot"]
    manifest = manifest_of(store, name)
    entry = next(a for a in manifest["allocations"] if a["path"] == "w/d")
    [[first, count, key, offset]] = entry["extents"]      # a full snapshot: one extent
    assert (first, count) == (0, 4)
    flipped = MiB + 12345                                  # inside block 1: [1 MiB, 2 MiB)
    flip_byte(os.path.join(store, key), offset + flipped)
    bad = [MiB, 2 * MiB]

    verified = daemon.cli("snapshot", "verify", store, check=UNCORRECTABLE)
    out = verified.stdout.decode()
    assert f"{name}: DAMAGED:" in out and "'w/d'" in out, out
    assert f"(bytes {MiB}-{2 * MiB - 1})" in out and "w/ok" not in out, out
    assert "1 damaged" in verified.stderr.decode(), verified.stderr

    def check_degraded(c, path: str) -> None:
        info = c.info(path)
        assert info["state"] == "degraded", info
        ranges = info["damaged"]
        assert ranges and all(a % ECC_BLOCK == 0 and b % ECC_BLOCK == 0 for a, b in ranges)
        covered = sorted(x for a, b in ranges for x in range(a, b, ECC_BLOCK))
        assert covered == list(range(bad[0], bad[1], ECC_BLOCK)), ranges
        with pytest.raises(GpumemError) as exc:
            c.read(path, flipped, 16)
        assert exc.value.code == UNCORRECTABLE
        with pytest.raises(GpumemError) as exc:
            c.read_copy(path, flipped - 100, 200)
        assert exc.value.code == UNCORRECTABLE
        assert c.read_copy(path, 0, bad[0]) == data["w/d"][:bad[0]]
        assert c.read_copy(path, bad[1], specs["w/d"]["size"]) == data["w/d"][bad[1]:]
        assert c.read("w/ok") == data["w/ok"]

    copy = daemon.cli("snapshot", "restore", store, "--as", "copy", check=UNCORRECTABLE)
    assert "'copy/w/d' is degraded" in copy.stderr.decode(), copy.stderr
    with daemon.client() as c:
        check_degraded(c, "copy/w/d")
        assert c.read("copy/w/ok") == data["w/ok"]
        assert c.info("copy/w/ok")["state"] == "ready"

    lose_memory(daemon)
    daemon.cli("snapshot", "restore", store, "w", check=UNCORRECTABLE)
    with daemon.client() as c:
        check_degraded(c, "w/d")
        assert c.info("w/ok")["state"] == "ready"
    cli_read = daemon.cli("read", "w/d", "--offset", str(flipped), "--length", "16")
    assert cli_read.returncode == UNCORRECTABLE and cli_read.stdout == b"", cli_read

    # The manifest itself: one hex digit of a block checksum changed (still valid JSON).
    path = os.path.join(store, name, "manifest.json")
    with open(path, "rb") as f:
        raw = f.read()
    at = raw.index(entry["blocks"][0].encode())
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"0" if raw[at:at + 1] != b"0" else b"1")
    verified = daemon.cli("snapshot", "verify", store, check=UNCORRECTABLE)
    out = verified.stdout.decode()
    assert f"{name}: DAMAGED:" in out and "manifest" in out and "checksum" in out, out
    before = daemon.cli_json("ls", "-R")
    refused = daemon.cli("snapshot", "restore", store, "--as", "other", check=UNCORRECTABLE)
    assert "manifest" in refused.stderr.decode(), refused.stderr
    assert daemon.cli_json("ls", "-R") == before                     # nothing made
    daemon.cli("snapshot", "restore", os.path.join(store, name), "--as", "other2",
               check=UNCORRECTABLE)
    assert daemon.cli_json("ls", "-R") == before


# ---- 5. kill -9 during create -----------------------------------------------------------------
def _data_bytes(store: str, name: str) -> int:
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(os.path.join(store, name, "data")):
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat().st_size
    return total


@pytest.mark.slow
def test_create_killed_midway_leaves_a_partial_snapshot(daemon, request):
    """`snapshot create` killed with SIGKILL while writing: the previous snapshot still
    verifies and restores byte-identically, `snapshot ls` shows the killed one `partial`,
    `snapshot rm --keep 1` removes it, and the allocation is not left locked."""
    store = make_store(request)
    size = 256 * MiB
    data = fill(daemon, {"huge": {"size": size, "seed": 5}})["huge"]
    good = daemon.cli_json("snapshot", "create", store)["snapshot"]

    proc = gpumemctl_popen(daemon, "snapshot", "create", store, "--quiet")
    try:
        def writing():
            if proc.poll() is not None:
                raise AssertionError(f"snapshot create ended ({proc.returncode}) before it "
                                     "could be killed: " + proc.stderr.read().decode())
            return [n for n in snapshot_dirs(store) if n != good and _data_bytes(store, n)]
        [killed] = wait_for(writing, 30, 0.001, "the new snapshot's first data bytes")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(store, killed, "manifest.json"))

    rows = {r["snapshot"]: r for r in daemon.cli_json("snapshot", "ls", store)}
    assert rows[good]["state"] == "complete" and rows[killed]["state"] == "partial", rows
    verified = daemon.cli("snapshot", "verify", store, check=True)
    assert f"{killed}: partial" in verified.stdout.decode(), verified.stdout
    assert b"0 damaged" in verified.stderr, verified.stderr
    daemon.cli("snapshot", "verify", os.path.join(store, good), "--quiet", check=True)

    restored = daemon.cli_json("snapshot", "restore", store, "--as", "r")
    assert restored["snapshot"] == good                # the newest *complete* one
    with daemon.client() as c:
        assert digest(c.read("r/huge")) == digest(data)

    removed = daemon.cli_json("snapshot", "rm", store, "--keep", "1")
    assert (removed["removed"], removed["kept"]) == ([killed], [good]), removed
    assert snapshot_dirs(store) == [good]
    assert [r["snapshot"] for r in daemon.cli_json("snapshot", "ls", store)] == [good]

    with daemon.client() as c:
        wait_for(lambda: c.info("huge")["holders"] == [], 10,
                 what="the killed client's read handle to go")
        c.write("huge", b"still writable", 4096)
        assert c.read("huge", 4096, 14) == b"still writable"
        assert c.check()["clean"]


# ---- 6. a restore that dies, and one in progress ------------------------------------------------
@pytest.mark.slow
def test_restore_killed_midway_leaves_lost(daemon, request):
    """`snapshot restore` killed with SIGKILL while it fills an allocation: the allocation
    ends `lost` (never `ready` half-filled), `check` is clean, and a second restore brings
    every byte back."""
    store = make_store(request)
    size = 256 * MiB
    data = fill(daemon, {"huge": {"size": size, "seed": 6, "mode": 0o600}})["huge"]
    daemon.cli("snapshot", "create", store, "--quiet", check=True)
    lose_memory(daemon)

    with daemon.client() as c:
        proc = gpumemctl_popen(daemon, "snapshot", "restore", store, "--quiet")
        try:
            def restoring():
                if proc.poll() is not None:
                    raise AssertionError(f"snapshot restore ended ({proc.returncode}) before "
                                         "it could be killed")
                return c.info("huge")["state"] == "restoring"
            wait_for(restoring, 30, 0.001, "the allocation to be restoring")
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        wait_for(lambda: c.info("huge")["state"] != "restoring", 10,
                 what="the daemon to see the restore die")
        info = c.info("huge")
        assert info["state"] == "lost" and info["holders"] == [], info
        with pytest.raises(GpumemError) as exc:
            c.read("huge", 0, 16)
        assert exc.value.code == INVALID_STATE
        assert c.check()["clean"], c.check()
        lost = [e for e in c.events() if e["kind"] == "lost" and e["path"] == "huge"]
        assert "did not complete" in lost[-1]["detail"]["reason"], lost

    daemon.cli("snapshot", "restore", store, "--quiet", check=True)
    with daemon.client() as c:
        assert digest(c.read("huge")) == digest(data)
        info = c.info("huge")
        assert (info["state"], info["durable"], info["mode"]) == ("ready", True, "0600")
        assert c.check()["clean"], c.check()


def test_restoring_allocation_is_not_served(daemon, request):
    """While a restore fills an allocation (a refill handle held open), `info` says
    `restoring`, reads fail with exit 10, a second restore of it is refused as busy; a
    restore that closes without saying it finished leaves it `lost` (a name it made is
    removed)."""
    store = make_store(request)
    data = fill(daemon, {"r/x": {"size": 4 * MiB, "mode": 0o600}})["r/x"]
    daemon.cli("snapshot", "create", store, "--quiet", check=True)
    lose_memory(daemon)

    with daemon.client() as filler, daemon.client() as c:
        handle = filler.refill("r/x", size=4 * MiB, mode=0o600, durable=True)
        handle.write(data[:MiB])                                 # half done
        info = c.info("r/x")
        assert info["state"] == "restoring", info
        with pytest.raises(GpumemError) as exc:
            c.read("r/x")
        assert exc.value.code == INVALID_STATE and "being restored" in str(exc.value)
        with pytest.raises(GpumemError) as exc:
            c.read_copy("r/x", 0, 16)
        assert exc.value.code == INVALID_STATE
        cli_read = daemon.cli("read", "r/x", "--length", "16")
        assert cli_read.returncode == INVALID_STATE and cli_read.stdout == b"", cli_read
        second = daemon.cli("snapshot", "restore", store, check=BUSY)
        assert "being restored" in second.stderr.decode(), second.stderr
        assert c.info("r/x")["state"] == "restoring"

        handle.close()                                          # gave up: no `restored`
        assert c.info("r/x")["state"] == "lost"

        fresh = filler.refill("r/new", size=MiB)
        assert c.info("r/new")["state"] == "restoring"
        fresh.close()
        with pytest.raises(GpumemError) as exc:
            c.info("r/new")
        assert exc.value.code == NOT_FOUND
        assert c.check()["clean"], c.check()

    daemon.cli("snapshot", "restore", store, "--quiet", check=True)
    with daemon.client() as c:
        assert c.read("r/x") == data and c.info("r/x")["state"] == "ready"


# ---- 7. permissions ---------------------------------------------------------------------------
def _nobody_snapshots(sock: str, store: str, denied: str, mine: bytes) -> dict:
    c = Client(sock)
    c.create("mine", len(mine), durable=True, mode=0o600)
    c.write("mine", mine)
    c.close()
    return {"named": cli_as(sock, "snapshot", "create", store, "secret"),
            "all": cli_as(sock, "snapshot", "create", store, "--json"),
            "root_store": cli_as(sock, "snapshot", "create", denied)}


def _nobody_restores(sock: str, store: str) -> dict:
    out = {"public": cli_as(sock, "snapshot", "restore", store, "public"),
           "all": cli_as(sock, "snapshot", "restore", store, "--json")}
    c = Client(sock)
    out["mine"] = hashlib.sha256(c.read("mine")).hexdigest()
    c.close()
    return out


@as_root
def test_permissions_of_snapshot_and_restore(daemon, request):
    """Another user (uid 65534) cannot snapshot root's 0600 allocation (named: exit 6; not
    named: left out), nor restore over root's lost allocation it may not write (exit 6, it
    stays lost); it can snapshot and restore its own."""
    store = make_store(request, owner=NOBODY)
    data = fill(daemon, {"secret": {"size": MiB, "mode": 0o600},
                         "public": {"size": MiB, "mode": 0o644}})
    mine = noise(MiB + 11)

    denied = make_store(request)                     # root's, 0700
    made = run_as(_nobody_snapshots, daemon.socket, store, denied, mine)
    assert made["named"]["code"] == PERMISSION, made["named"]
    assert "may not read 'secret'" in made["named"]["stderr"], made["named"]
    assert made["all"]["code"] == 0, made["all"]
    result = json.loads(made["all"]["stdout"])
    assert sorted(a["path"] for a in result["allocations"]) == ["mine", "public"]
    assert [s["path"] for s in result["skipped"]] == ["secret"]
    assert made["root_store"]["code"] == PERMISSION, made["root_store"]
    assert "permission denied" in made["root_store"]["stderr"] and os.listdir(denied) == []
    manifest = manifest_of(store, result["snapshot"])
    assert sorted(a["path"] for a in manifest["allocations"]) == ["mine", "public"]
    assert os.stat(os.path.join(store, result["snapshot"])).st_uid == NOBODY

    lose_memory(daemon)
    assert states(daemon) == {"mine": "lost", "public": "lost", "secret": "lost"}
    back = run_as(_nobody_restores, daemon.socket, store)
    assert back["public"]["code"] == PERMISSION, back["public"]
    assert "permission denied" in back["public"]["stderr"], back["public"]
    assert back["all"]["code"] == PERMISSION, back["all"]
    results = {a["path"]: a["result"] for a in json.loads(back["all"]["stdout"])["allocations"]}
    assert results["mine"] == "ok" and results["public"] != "ok", results
    assert back["mine"] == digest(mine)
    assert states(daemon) == {"mine": "ready", "public": "lost", "secret": "lost"}
    info = daemon.cli_json("info", "mine")
    assert (info["uid"], info["mode"], info["durable"]) == (NOBODY, "0600", True)

    # Root restores from 65534's files only when told to trust them (issue 24, item 5).
    untrusted = daemon.cli("snapshot", "restore", store, "public", check=PERMISSION)
    assert "is owned by uid 65534, not by you or root" in untrusted.stderr.decode()
    assert states(daemon)["public"] == "lost"
    daemon.cli("snapshot", "restore", store, "public", "--trust-uid", str(NOBODY), "--quiet",
               check=True)
    with daemon.client() as c:
        assert c.read("public") == data["public"]
        assert c.check()["clean"], c.check()


# ---- 8. rm, ls, an empty store ------------------------------------------------------------------
def test_rm_ls_and_empty_store(daemon, request):
    """`snapshot rm STORE` alone is refused (exit 2, one line); `rm STORE/snap-...` removes
    exactly that one; removing the snapshot an incremental one builds on keeps the data it
    needs (`retired`); `ls --json` describes each; a restore from an empty store exits 4."""
    store = make_store(request)
    data = fill(daemon, {"a": {"size": 3 * MiB + 1, "mode": 0o600}})["a"]
    names = [daemon.cli_json("snapshot", "create", store)["snapshot"] for _ in range(3)]
    assert snapshot_dirs(store) == sorted(names) == names

    rows = daemon.cli_json("snapshot", "ls", store)
    assert [r["snapshot"] for r in rows] == names
    for r in rows:
        assert r["location"] == os.path.join(store, r["snapshot"])
        assert (r["state"], r["parent"], r["allocations"], r["bytes"], r["bytes_written"]) == \
            ("complete", None, 1, 3 * MiB + 1, 3 * MiB + 1), r
        assert isinstance(r["created_ns"], int) and r["created_ns"] > 0
    table = daemon.cli("snapshot", "ls", store, check=True).stdout.decode().splitlines()
    assert table[0].split()[:2] == ["SNAPSHOT", "STATE"] and len(table) == 4, table

    refused = daemon.cli("snapshot", "rm", store, check=USAGE)
    err = refused.stderr.decode()
    assert err.count("\n") == 1 and "--keep" in err and "3 snapshot(s)" in err, err
    assert snapshot_dirs(store) == names

    daemon.cli("snapshot", "rm", os.path.join(store, names[1]), check=True)
    assert snapshot_dirs(store) == [names[0], names[2]]
    daemon.cli("snapshot", "rm", os.path.join(store, names[1]), check=NOT_FOUND)

    with daemon.client() as c:
        c.write("a", b"changed", 2 * MiB + 5)
    inc = daemon.cli_json("snapshot", "create", store, "--incremental")
    assert (inc["parent"], inc["bytes_written"]) == (names[2], MiB)
    daemon.cli("snapshot", "rm", os.path.join(store, names[2]), check=True)  # its parent
    rows = {r["snapshot"]: r["state"] for r in daemon.cli_json("snapshot", "ls", store)}
    assert rows == {names[0]: "complete", names[2]: "retired", inc["snapshot"]: "complete"}
    daemon.cli("snapshot", "verify", store, "--quiet", check=True)
    daemon.cli("snapshot", "restore", store, "--as", "inc", "--quiet", check=True)
    expected = bytearray(data)
    expected[2 * MiB + 5:2 * MiB + 12] = b"changed"
    with daemon.client() as c:
        assert c.read("inc/a") == bytes(expected)

    empty = make_store(request)
    before = daemon.cli_json("ls", "-R")
    assert daemon.cli_json("snapshot", "ls", empty) == []
    missing = daemon.cli("snapshot", "restore", empty, check=NOT_FOUND)
    assert "no complete snapshot" in missing.stderr.decode(), missing.stderr
    daemon.cli("snapshot", "restore", os.path.join(empty, "nothing-here"), check=NOT_FOUND)
    assert daemon.cli_json("ls", "-R") == before


# ---- 9. events and status ---------------------------------------------------------------------
def test_events_and_status_record_snapshots_and_restores(daemon, request):
    """After a create and a restore, `gpumemctl events` shows a `snapshot` event for each
    (action create / restore, result ok) and `restore` events (begin, done) for the
    allocation restored; `status` shows the newest create and restore."""
    store = make_store(request)
    fill(daemon, {"e/x": {"size": 2 * MiB}})
    made = daemon.cli_json("snapshot", "create", store)
    daemon.cli("snapshot", "restore", store, "--as", "copy", "--quiet", check=True)

    events = daemon.cli_json("events")
    snaps = [e["detail"] for e in events if e["kind"] == "snapshot"]
    creates = [s for s in snaps if s["action"] == "create"]
    restores = [s for s in snaps if s["action"] == "restore"]
    assert len(creates) == 1 and len(restores) == 1, snaps
    assert (creates[0]["result"], creates[0]["snapshot"], creates[0]["location"],
            creates[0]["allocations"], creates[0]["bytes"]) == \
        ("ok", made["snapshot"], made["location"], 1, 2 * MiB), creates
    assert (restores[0]["result"], restores[0]["snapshot"], restores[0]["allocations"]) == \
        ("ok", made["snapshot"], 1), restores
    steps = [(e["path"], e["detail"]["action"]) for e in events if e["kind"] == "restore"]
    assert steps == [("copy/e/x", "begin"), ("copy/e/x", "done")], steps
    done = next(e for e in events if e["kind"] == "restore" and e["detail"]["action"] == "done")
    assert done["detail"]["damaged_blocks"] == 0 and done["uid"] == os.getuid()

    status = daemon.cli_json("status")["snapshots"]
    assert status["create"]["snapshot"] == made["snapshot"], status
    assert status["restore"]["result"] == "ok", status
    assert daemon.cli_json("info", "e/x")["snapshot"] == made["location"]



# ---- what the first review found ------------------------------------------------------------
def test_a_snapshot_taken_after_a_reboot_still_holds_what_the_reboot_lost(daemon, request):
    """After a reboot, `create` has no memory to copy for a lost allocation: it carries its
    entry over from the newest snapshot (the data stays there), so the new snapshot is
    whole, `rm --keep 1` keeps that data, and a restore from the new one brings it back.
    One that no snapshot holds is named and the exit is 10."""
    store = make_store(request)
    data = fill(daemon, {"x": {"size": 2 * MiB + 5}})
    daemon.cli("snapshot", "create", store, check=True)
    lose_memory(daemon)
    fill(daemon, {"never": {"size": MiB}})
    with daemon.client() as c:
        c.remove("never")
    proc = daemon.cli("snapshot", "create", store, "--json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert [(a["path"], a["carried"]) for a in made["allocations"]] == [("x", True)]
    assert made["bytes_written"] == 0
    daemon.cli("snapshot", "rm", store, "--keep", "1", check=True)
    assert daemon.cli("snapshot", "verify", store).returncode == 0
    daemon.cli("snapshot", "restore", store, "--quiet", check=True)
    with daemon.client() as c:
        assert c.read("x") == data["x"] and c.info("x")["state"] == "ready"

    other = make_store(request)                        # a store that never held it
    lose_memory(daemon)
    proc = daemon.cli("snapshot", "create", other, "--json")
    assert proc.returncode == INVALID_STATE, proc.stderr
    assert b"'x' is lost and no snapshot in this store holds it" in proc.stderr


def test_restore_as_brings_back_a_hard_link_in_another_directory(daemon, request):
    store = make_store(request)
    data = fill(daemon, {"models/v2": {"size": MiB + 1}})
    with daemon.client() as c:
        c.mkdir("pinned")
        c.link("models/v2", "pinned/v2")
    daemon.cli("snapshot", "create", store, check=True)
    daemon.cli("snapshot", "restore", store, "--as", "copy", check=True)
    info = daemon.cli_json("info", "copy/models/v2")
    assert sorted(info["names"]) == ["copy/models/v2", "copy/pinned/v2"]
    with daemon.client() as c:
        assert c.read("copy/pinned/v2") == data["models/v2"]


def test_a_short_data_object_damages_only_the_blocks_it_lacks(daemon, request):
    daemon.allow_errors = True          # the damage is logged at ERROR, as it should be
    store = make_store(request)
    data = fill(daemon, {"w": {"size": 3 * MiB + 100}})
    made = daemon.cli_json("snapshot", "create", store)
    path = os.path.join(store, made["snapshot"], "data", "0.bin")
    os.truncate(path, os.path.getsize(path) - 10)
    proc = daemon.cli("snapshot", "restore", store, "--as", "r", "--json")
    assert proc.returncode == UNCORRECTABLE
    info = daemon.cli_json("info", "r/w")
    assert info["damaged"] == [[3 * MiB, 3 * MiB + ECC_BLOCK]]    # the last block alone
    with daemon.client() as c:
        assert c.read_copy("r/w", 0, 3 * MiB) == data["w"][:3 * MiB]


def test_a_refused_create_leaves_nothing_in_the_store(daemon, request):
    store = make_store(request, owner=NOBODY)
    fill(daemon, {"secret": {"size": MiB, "mode": 0o600}})
    result = run_as(cli_as, daemon.socket, "snapshot", "create", store, "secret")
    assert result["code"] == PERMISSION, result
    assert os.listdir(store) == []


def test_snapshot_on_stop_and_restore_on_start_bring_memory_back_unattended(daemon_factory,
                                                                            request,
                                                                            tmp_path):
    """With snapshot_dir, snapshot_on_stop and restore_on_start, no command is run by hand:
    the clean stop snapshots the durable allocations, the memory is lost (keeper killed, as
    by a reboot), and the next start refills them in the background until each is
    `ready` with every byte back; transient ones are not snapshotted."""
    store = make_store(request)
    config = tmp_path / "gpumemd.toml"
    config.write_text(f'snapshot_dir = "{store}"\nsnapshot_on_stop = true\n'
                      "restore_on_start = true\n")
    d = daemon_factory(extra_args=["--config", str(config)])
    data = fill(d, {"models/a": {"size": 9 * MiB + 1}, "b": {"size": 4096, "mode": 0o600}})
    fill(d, {"scratch": {"size": MiB, "durable": False}})
    lose_memory(d)
    (snap,) = snapshot_dirs(store)
    assert sorted(a["path"] for a in manifest_of(store, snap)["allocations"]) == \
        ["b", "models/a"]
    wait_for(lambda: set(states(d).values()) == {"ready"}, 30,
             what="restore_on_start to finish")
    with d.client() as c:
        for path, want in data.items():
            assert c.read(path) == want, path
        assert c.info("b")["mode"] == "0600"
        assert c.check()["clean"], c.check()
    kinds = [(e["kind"], e["detail"].get("action")) for e in d.cli_json("events", "-n", "1000")]
    assert ("snapshot", "create") in kinds and ("snapshot", "restore") in kinds
    assert "snapshot_on_stop" in d.log() and "restore_on_start: 2 of 2" in d.log()


def test_rm_keeps_data_a_kept_but_unreadable_manifest_may_need(daemon, request):
    """Removing a snapshot while a newer one's manifest cannot be read: that manifest may
    refer to the removed one's data, so the data stays (`retired`), never deleted blind."""
    store = make_store(request)
    fill(daemon, {"w": {"size": 3 * MiB}})
    old = daemon.cli_json("snapshot", "create", store)["snapshot"]
    with daemon.client() as c:
        c.write("w", b"new", offset=MiB)
    new = daemon.cli_json("snapshot", "create", store, "--incremental")["snapshot"]
    flip_byte(os.path.join(store, new, "manifest.json"), 40)
    daemon.cli("snapshot", "rm", os.path.join(store, old), check=True)
    assert os.listdir(os.path.join(store, old, "data")), "the old data was deleted"
    states_now = {r["snapshot"]: r["state"] for r in daemon.cli_json("snapshot", "ls", store)}
    assert states_now == {old: "retired", new: "damaged"}
