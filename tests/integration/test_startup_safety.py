"""Start-up safety (issue 13, item 5; docs/durability.md, "Start-up safety"): a registry that
is missing, replaced or older than what the keeper holds is a refusal to start in one line
(exit 3) that changes nothing; --adopt-orphans re-registers that memory under /lost+found,
--free-orphans frees it; crash residue is still freed, with a warning; an unreadable registry
is one line (exit 4), never a traceback."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3

import pytest

from daemon.keeper.link import ProcessKeeper
from daemon.registry import Registry
from gpumemctl import Client
from gpumemctl.protocol import GpumemError

MiB = 1 << 20
NOBODY = 65534
REFUSED, UNREADABLE = 3, 4          # gpumemd's exit statuses (gpumemd(8))
DATA = {"models/weights": hashlib.shake_256(b"w").digest(3 * MiB + 5),
        "kv": hashlib.shake_256(b"k").digest(4096)}


def registry_files(d) -> list[str]:
    path = os.path.join(d.state_dir, "registry.sqlite")
    return [path + suffix for suffix in ("", "-wal", "-shm")]


def fill(d, data: dict[str, bytes]) -> dict[str, int]:
    """Durable allocations holding `data`; returns their ids (the keeper's keys)."""
    ids = {}
    with d.client() as c:
        for path, content in data.items():
            ids[path] = c.create(path, len(content), durable=True)["id"]
            c.write(path, content)
    return ids


def save_registry(d, where: str) -> None:
    os.makedirs(where)
    for path in registry_files(d):
        if os.path.exists(path):
            shutil.copy2(path, where)


def remove_registry(d) -> None:
    for path in registry_files(d):
        if os.path.exists(path):
            os.unlink(path)


def restore_registry(d, where: str) -> None:
    remove_registry(d)
    for name in os.listdir(where):
        shutil.copy2(os.path.join(where, name), d.state_dir)


def start_refused(d, *args: str) -> tuple[int, list[str]]:
    """Start gpumemd expecting it to exit; its exit status and its `gpumemd:` lines."""
    seen = len(d.log())
    layout = list(d.extra_args)         # the options the test runs with (slabs_off)
    d.extra_args = layout + list(args)
    d.start(wait=False)
    d.extra_args = layout
    status = d.proc.wait(30)
    new = d.log()[seen:]
    assert "Traceback" not in new, new
    return status, [line for line in new.splitlines() if line.startswith("gpumemd: ")]


def start_with(d, *args: str) -> None:
    """Start with `args` once, keeping the layout options the test runs with (slabs_off)."""
    layout = list(d.extra_args)
    d.extra_args = layout + list(args)
    d.start()
    d.extra_args = layout


def assert_intact(d, data: dict[str, bytes], prefix: str = "") -> None:
    with d.client() as c:
        for path, content in data.items():
            got = c.read(prefix + path)
            assert got[:len(content)] == content, path
            assert not got[len(content):].strip(b"\0"), path     # the rest as allocated
        assert c.check()["clean"], c.check()


def keeper_held(d) -> int:
    return d.cli_json("status")["keeper"]["held"]


@pytest.mark.slabs_off
def test_missing_registry_refuses_and_the_bytes_survive_its_restore(daemon, tmp_path):
    fill(daemon, DATA)
    daemon.kill9()
    save_registry(daemon, str(tmp_path / "backup"))
    remove_registry(daemon)
    status, lines = start_refused(daemon)
    registry = os.path.join(daemon.state_dir, "registry.sqlite")
    assert status == REFUSED
    assert lines == [
        f"gpumemd: the keeper holds 2 allocations (6M) that registry {registry} does not "
        "list (it is new): restore the registry, or start with --adopt-orphans to "
        "re-register them under /lost+found/, or with --free-orphans to free their memory"]
    assert not any(os.path.exists(p) for p in registry_files(daemon))   # nothing left behind
    assert daemon.keeper_pid() is not None
    restore_registry(daemon, str(tmp_path / "backup"))
    daemon.start()
    assert_intact(daemon, DATA)
    assert "orphan" not in [e["kind"] for e in daemon.cli_json("events")]


def test_replaced_registry_refuses(daemon):
    """A registry file that is sound but not the one the keeper's memory belongs to (each
    registry has a random identity, which every deposit carries)."""
    fill(daemon, DATA)
    daemon.kill9()
    remove_registry(daemon)
    Registry(os.path.join(daemon.state_dir, "registry.sqlite")).close()   # another one
    status, lines = start_refused(daemon)
    assert status == REFUSED and len(lines) == 1
    assert "holds 2 allocations" in lines[0]
    assert "(they were deposited for another registry)" in lines[0]
    assert os.path.exists(registry_files(daemon)[0])      # not ours to remove


@pytest.mark.slabs_off
def test_registry_older_than_the_keeper_refuses(daemon, tmp_path):
    """A backup taken before two durable creates: restoring it must not free them."""
    fill(daemon, {"old": b"from before the backup"})
    assert daemon.stop() == 0
    save_registry(daemon, str(tmp_path / "backup"))
    daemon.start()
    ids = fill(daemon, DATA)
    daemon.kill9()
    restore_registry(daemon, str(tmp_path / "backup"))
    status, lines = start_refused(daemon)
    assert status == REFUSED and len(lines) == 1
    assert "holds 2 allocations (6M)" in lines[0] and "(it is older than what the keeper " \
        "holds)" in lines[0]
    start_with(daemon, "--adopt-orphans")
    assert_intact(daemon, {"old": b"from before the backup"})
    recovered = recovery_dir(daemon)
    names = {str(ids[path]): content for path, content in DATA.items()}
    assert sorted(e["name"] for e in daemon.cli_json("ls", recovered)) == sorted(names)
    assert_intact(daemon, names, recovered + "/")


def recovery_dir(d) -> str:
    [entry] = d.cli_json("ls", "lost+found")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", entry["name"]), entry
    return entry["path"]


def info_as_nobody(socket_path: str, path: str) -> int:
    """`info` of `path` as uid/gid 65534, in a forked child; the error code, or 0."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 70
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with Client(socket_path) as c:
                c.info(path)
            code = 0
        except GpumemError as exc:
            code = exc.code
        finally:
            os.write(write_end, json.dumps(code).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        result = json.loads(f.read())
    os.waitpid(child, 0)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
@pytest.mark.slabs_off
def test_adopt_orphans_reregisters_them_durable_under_lost_found(daemon):
    ids = fill(daemon, DATA)
    daemon.kill9()
    remove_registry(daemon)
    start_with(daemon, "--adopt-orphans")
    recovered = recovery_dir(daemon)
    for directory in ("lost+found", recovered):
        info = daemon.cli_json("info", directory)
        assert (info["uid"], info["mode"]) == (0, "0700")
    entries = {e["name"]: e for e in daemon.cli_json("ls", recovered)}
    names = {str(ids[p]): p for p in DATA}
    for name, path in names.items():
        entry = entries[name]
        assert (entry["uid"], entry["mode"], entry["durable"], entry["state"]) == \
            (0, "0600", True, "ready")
        assert entry["size"] == entry["capacity"] >= len(DATA[path])   # the kept capacity
    assert_intact(daemon, {n: DATA[p] for n, p in names.items()}, recovered + "/")
    assert info_as_nobody(daemon.socket, f"{recovered}/{next(iter(names))}") == 6
    kinds = [e["kind"] for e in daemon.cli_json("events")]
    assert kinds.count("adopt") == 2 and "orphan" not in kinds
    daemon.restart()            # they are this registry's now: no refusal, nothing freed
    assert_intact(daemon, {n: DATA[p] for n, p in names.items()}, recovered + "/")
    assert keeper_held(daemon) == 2


def test_free_orphans_frees_them(daemon):
    fill(daemon, DATA)
    daemon.kill9()
    remove_registry(daemon)
    start_with(daemon, "--free-orphans")
    assert daemon.cli_json("ls", "-R") == []
    assert keeper_held(daemon) == 0
    orphans = [e for e in daemon.cli_json("events") if e["kind"] == "orphan"]
    assert len(orphans) == 2 and "--free-orphans" in orphans[0]["detail"]["reason"]
    daemon.restart()
    assert daemon.cli_json("ls", "-R") == []


@pytest.mark.slabs_off          # keeper entries counted per allocation: no parity arena
def test_crash_residue_is_still_freed_with_a_warning(daemon):
    """A kill -9 between a durable create's deposit and its commit leaves one key the
    registry never committed: that is no reason to refuse, and its memory was never handed
    to anyone, so the start frees it (docs/durability.md, "Crash ordering"), loudly."""
    ids = fill(daemon, DATA)
    daemon.kill9()
    db = sqlite3.connect(registry_files(daemon)[0])
    instance = db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]
    db.close()
    residue = max(ids.values()) + 1
    memory = os.memfd_create("residue", os.MFD_CLOEXEC)
    os.ftruncate(memory, 2 * MiB)
    keeper = ProcessKeeper(daemon.state_dir)
    keeper.ensure_running()
    keeper.deposit(residue, [memory], {"capacity": 2 * MiB, "device": "x",
                                       "registry": instance})
    keeper.close()
    os.close(memory)
    daemon.start()
    assert_intact(daemon, DATA)
    assert keeper_held(daemon) == 2
    assert f"WARNING: freed the memory the keeper held under key {residue}" in daemon.log()
    [orphan] = [e for e in daemon.cli_json("events") if e["kind"] == "orphan"]
    assert orphan["detail"]["key"] == residue


def garbage(path: str) -> None:
    with open(path, "r+b") as f:
        f.write(os.urandom(4096))


def truncated(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


@pytest.mark.slabs_off          # keeper entries counted per allocation: no parity arena
@pytest.mark.parametrize("damage", [garbage, truncated])
def test_unreadable_registry_is_one_line_and_adopt_orphans_moves_it_aside(daemon, damage):
    fill(daemon, DATA)
    with daemon.client() as c:              # enough pages that a cut-off file misses some
        for i in range(300):
            c.mkdir(f"dirs/{i:04d}", parents=True)
    assert daemon.stop() == 0               # a clean stop leaves it all in the main file
    registry = registry_files(daemon)[0]
    damage(registry)
    status, lines = start_refused(daemon)
    assert status == UNREADABLE and len(lines) == 1, lines
    assert lines[0].startswith(f"gpumemd: registry {registry} is ")
    assert lines[0].endswith(": move it aside (with its -wal and -shm files) and restore it "
                             "from a backup, or start with --adopt-orphans to move it aside "
                             "and re-register what the keeper holds under /lost+found/")
    start_with(daemon, "--adopt-orphans")
    aside = [n for n in os.listdir(daemon.state_dir) if n.startswith("registry.sqlite.corrupt-")]
    assert len(aside) == 1
    recovered = recovery_dir(daemon)
    assert len(daemon.cli_json("ls", recovered)) == 2
    assert keeper_held(daemon) == 2
