"""Snapshot stores other users can write (issue 24, items 4, 5, 6 and 8): root's `snapshot`
commands (by hand, from cron, or as gpumemd's snapshot_on_stop/restore_on_start) against a
shared store in which uid 65534 plants symlinks, FIFOs, swapped directories and forged
snapshots. Each attack runs as 65534 (tests/users.py); the tests assert what root's command
did: its exit code and one-line message, the bytes and owners of allocations, and which
files are left where (docs/snapshots.md, "Who may write a store, and what a restore
trusts")."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time

import pytest

from gpumemctl import Client
from gpumemctl.protocol import NotFound
from gpumemctl.snapshots import manifest as fmt
from tests.harness import wait_for
from tests.snapstore import (
    MiB,
    cli_as,
    cli_measured,
    fill,
    lose_memory,
    make_store,
    one_line_error,
    read_manifest,
    states,
    write_manifest,
)
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

PERMISSION, UNCORRECTABLE, INVALID_STATE = 6, 8, 10
VICTIM = 1000                       # another user, whose allocations 65534 goes after
SIZE = MiB + 5
SHARED = 0o1777                     # a store everyone may create entries in
TRUST_ENV = "GPUMEMCTL_SNAPSHOT_TRUST_UIDS"     # documented: docs/snapshots.md


def _private_dir(request) -> tuple[str, dict[str, bytes]]:
    """Root's 0700 directory with files in it (and a subdirectory): what must survive."""
    path = tempfile.mkdtemp(prefix="gpumem-roots-")
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    files = {"secret": b"root's own\n", "sub/deeper": b"also root's\n"}
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
        with open(os.path.join(path, rel), "wb") as f:
            f.write(data)
    return path, files


def _files_of(path: str) -> dict[str, bytes]:
    out = {}
    for top, _dirs, names in os.walk(path):
        for n in names:
            with open(os.path.join(top, n), "rb") as f:
                out[os.path.relpath(os.path.join(top, n), path)] = f.read()
    return out


def _snapshot_names(store: str) -> list[str]:
    return sorted(n for n in os.listdir(store) if fmt.NAME_RE.fullmatch(n))


# ---- item 4: rm never follows a planted symlink ---------------------------------------------
def _plant_link(store: str, name: str, target: str) -> bool:
    os.symlink(target, os.path.join(store, name))
    return True


def test_rm_keep_never_deletes_through_a_planted_symlink(daemon, request):
    """65534 links `snap-20200101T000000.000000Z-aaaaaa -> root's 0700 directory` in a 1777
    store; root's `snapshot rm STORE --keep 1` removes root's older snapshot, keeps the
    newest, leaves the link alone (named, uid 65534), and every file in root's directory is
    still there; `rm STORE/snap-2020...` removes the link itself, never what it points to."""
    store = make_store(request, SHARED)
    private, files = _private_dir(request)
    fill(daemon, {"a": SIZE})
    old = daemon.cli_json("snapshot", "create", store)["snapshot"]
    new = daemon.cli_json("snapshot", "create", store)["snapshot"]
    planted = "snap-20200101T000000.000000Z-aaaaaa"
    assert run_as(_plant_link, store, planted, private)

    proc = daemon.cli("snapshot", "rm", store, "--keep", "1", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _files_of(private) == files
    assert _snapshot_names(store) == [planted, new]
    assert os.path.islink(os.path.join(store, planted))
    notes = one_line_error(proc.stderr)
    assert notes == [f"gpumemctl: warning: left alone, not yours to remove: {planted} "
                     f"(uid {NOBODY})"], notes
    assert old in proc.stdout.decode()

    rows = {r["snapshot"]: r for r in daemon.cli_json("snapshot", "ls", store)}
    assert (rows[planted]["state"], rows[planted]["owner"], rows[planted]["trusted"]) == \
        ("damaged", NOBODY, False)
    assert "is a symbolic link, not a snapshot directory" in rows[planted]["message"]
    assert rows[new]["state"] == "complete"

    daemon.cli("snapshot", "rm", os.path.join(store, planted), check=True)
    assert _files_of(private) == files and os.path.isdir(private)
    assert _snapshot_names(store) == [new]
    daemon.cli("snapshot", "verify", store, "--quiet", check=True)


# ---- item 5: a forged snapshot in a shared store ---------------------------------------------
def _victim_makes(sock: str, data: dict[str, bytes]) -> bool:
    with Client(sock) as c:
        c.mkdir("victim", mode=0o700)
        for path, blob in data.items():
            c.create(path, len(blob), durable=True, mode=0o600)
            c.write(path, blob)
    return True


def _nobody_snapshots_its_own(sock: str, store: str, blob: bytes) -> dict:
    with Client(sock) as c:
        c.mkdir("evil", mode=0o755)
        c.create("evil/x", len(blob), durable=True, mode=0o600)
        c.write("evil/x", blob)
    return cli_as(sock, "snapshot", "create", store, "evil/x", "--json")


def _forge(store: str, own: str, victim_uid: int) -> str:
    """65534 copies its snapshot under the newest name, points it at the victim's lost
    allocations (one entry claiming the victim as owner, with a further name in 65534's
    directory; one honest about its owner) and seals it again."""
    manifest = read_manifest(store, own)
    mine = manifest["allocations"][0]
    manifest["name"] = fmt.new_name()
    manifest["host"] = "another-node"
    manifest["allocations"] = [
        {**mine, "path": "victim/w", "uid": victim_uid, "names": ["evil/pin"]},
        {**mine, "path": "victim/v", "names": []},
    ]
    manifest["bytes"] = 2 * mine["size"]
    write_manifest(store, manifest)
    return manifest["name"]


def test_a_forged_snapshot_does_not_rewrite_or_pin_another_users_allocation(daemon, request):
    """The attack of item 5: 65534 plants a re-sealed copy of its own snapshot, pointed at
    uid 1000's lost 0600 allocations, as the newest in a shared store. Root's `snapshot
    restore STORE --lost-only` (what restore_on_start runs) passes it over with one line
    naming the file and its owner (exit 6) and restores the victim's own bytes from root's
    snapshot; no name of the victim's allocation appears in 65534's directory. With
    `--trust-uid 65534` (a fleet store under root_squash) the manifest's fields are still
    held to what they may do: the entry that claims the victim's allocation with a name in
    65534's directory, and the one recorded as 65534's, are both refused; they stay lost."""
    store = make_store(request, SHARED)
    victims = {"victim/w": os.urandom(SIZE), "victim/v": os.urandom(SIZE)}
    assert run_as(_victim_makes, daemon.socket, victims, uid=VICTIM, gid=VICTIM)
    evil = os.urandom(SIZE)
    made = run_as(_nobody_snapshots_its_own, daemon.socket, store, evil)
    assert made["code"] == 0, made
    own = json.loads(made["stdout"])["snapshot"]
    daemon.cli("snapshot", "create", store, "--quiet", check=True)     # root's: all three
    lose_memory(daemon)
    assert set(states(daemon).values()) == {"lost"}
    forged = run_as(_forge, store, own, VICTIM)

    proc = daemon.cli("snapshot", "restore", store, "--lost-only")
    with daemon.client() as c:
        for path, blob in victims.items():
            assert c.read(path) == blob, path
            info = c.info(path)
            assert (info["state"], info["uid"], info["links"]) == ("ready", VICTIM, 1), info
        assert c.read("evil/x") == evil
        with pytest.raises(NotFound):
            c.info("evil/pin")
    assert proc.returncode == PERMISSION, proc
    errors = one_line_error(proc.stderr)
    assert len(errors) == 2, errors                                    # forged, and its own
    line = next(e for e in errors if forged in e)
    assert f"{forged} is owned by uid {NOBODY}, not by you or root" in line
    assert "restored only from files its restorer or root wrote" in line

    lose_memory(daemon)
    proc = daemon.cli("snapshot", "restore", store, "--lost-only", "--trust-uid",
                      str(NOBODY))
    assert proc.returncode == PERMISSION, proc
    errors = one_line_error(proc.stderr)
    assert len(errors) == 2, errors
    assert any("not restoring the name 'evil/pin'" in e and "'evil' is owned by uid "
               f"{NOBODY}" in e for e in errors), errors
    assert any(f"'victim/v' is uid {VICTIM}'s" in e and f"uid {NOBODY}'s allocation" in e
               for e in errors), errors
    now = states(daemon)
    assert (now["victim/w"], now["victim/v"], now["evil/x"]) == ("lost", "lost", "ready")
    with daemon.client() as c, pytest.raises(NotFound):
        c.info("evil/pin")


def test_a_store_root_wrote_on_another_node_still_restores(daemon, request):
    """A legitimate fleet store: root's snapshot, its manifest naming another host, in a
    store directory that is not root's (an NFS export's owner) and that others may write:
    a plain restore brings every byte back."""
    store = make_store(request, 0o1777, owner=NOBODY)
    data = fill(daemon, {"models/a": SIZE, "b": 4096})
    name = daemon.cli_json("snapshot", "create", store)["snapshot"]
    manifest = read_manifest(store, name)
    manifest["host"] = "node-elsewhere"
    write_manifest(store, manifest)
    lose_memory(daemon)
    daemon.cli("snapshot", "restore", store, "--quiet", check=True)
    with daemon.client() as c:
        for path, blob in data.items():
            assert c.read(path) == blob and c.info(path)["state"] == "ready", path


def _nobody_snapshots(sock: str, store: str, blob: bytes) -> dict:
    with Client(sock) as c:
        c.create("mine", len(blob), durable=True, mode=0o600)
        c.write("mine", blob)
    return cli_as(sock, "snapshot", "create", store, "--quiet")


def test_restore_on_start_trusts_another_writer_only_when_told(daemon_factory, request,
                                                               tmp_path):
    """A fleet store whose files another uid writes (NFS root_squash makes root's writes
    65534's): gpumemd's restore_on_start (a root child) passes over 65534's snapshot and
    leaves the allocation lost, logging why, until the unit's environment trusts that uid
    (GPUMEMCTL_SNAPSHOT_TRUST_UIDS, inherited by the child as GPUMEMCTL_SNAPSHOT_IO is);
    then it refills it."""
    store = make_store(request, 0o755, owner=NOBODY)
    config = tmp_path / "gpumemd.toml"
    config.write_text(f'snapshot_dir = "{store}"\nrestore_on_start = true\n')
    d = daemon_factory(extra_args=["--config", str(config)])
    d.allow_errors = True              # the refused restore is logged at ERROR, on purpose
    blob = os.urandom(SIZE)
    assert run_as(_nobody_snapshots, d.socket, store, blob)["code"] == 0

    lose_memory(d)
    wait_for(lambda: "restore_on_start ended with exit status 6" in d.log(), 30,
             what="restore_on_start to give up")
    assert states(d) == {"mine": "lost"}
    assert f"is owned by uid {NOBODY}, not by you or root" in d.log()

    d.extra_env = {TRUST_ENV: str(NOBODY)}
    lose_memory(d)
    wait_for(lambda: states(d) == {"mine": "ready"}, 30, what="restore_on_start")
    with d.client() as c:
        assert c.read("mine") == blob


# ---- item 6: FIFOs and symlinks where a manifest should be -----------------------------------
def _plant_fifo_and_zero(store: str) -> list[str]:
    fifo, zero = fmt.new_name(), fmt.new_name()
    for name in (fifo, zero):
        os.mkdir(os.path.join(store, name), 0o755)
    os.mkfifo(os.path.join(store, fifo, "manifest.json"))
    os.symlink("/dev/zero", os.path.join(store, zero, "manifest.json"))
    return [fifo, zero]


RSS_LIMIT = 300 * MiB              # the CLI itself is well under; /dev/zero read was 1 GiB


def test_a_fifo_or_dev_zero_manifest_neither_hangs_nor_grows_root_commands(daemon, request):
    """65534 plants two newer snapshots in a 1777 store: one whose manifest.json is a FIFO,
    one whose manifest.json is a symlink to /dev/zero. Root's `ls`, `create` and `restore`
    finish (each killed after 60 s otherwise) with small memory, name each planted one in
    one line, and list, build on and restore from root's own snapshot."""
    store = make_store(request, SHARED)
    data = fill(daemon, {"a": SIZE})
    mine = daemon.cli_json("snapshot", "create", store)["snapshot"]
    fifo, zero = run_as(_plant_fifo_and_zero, store)

    listed = cli_measured(daemon, "snapshot", "ls", store)
    assert listed["code"] == 0, listed
    assert listed["max_rss"] < RSS_LIMIT, listed["max_rss"]
    rows = {line.split()[0]: line.split()[1] for line in
            listed["stdout"].decode().splitlines()[1:]}
    assert rows == {mine: "complete", fifo: "damaged", zero: "damaged"}, rows
    notes = one_line_error(listed["stderr"])
    assert any(f"{fifo}/manifest.json is a FIFO, not a snapshot file" in n for n in notes)
    assert any(f"{zero}/manifest.json is a symbolic link, not a snapshot file" in n
               for n in notes), notes

    made = cli_measured(daemon, "snapshot", "create", store, "--incremental")
    assert made["code"] == 0, made
    assert made["max_rss"] < RSS_LIMIT
    warnings = one_line_error(made["stderr"])
    assert len(warnings) == 2 and all(f"is owned by uid {NOBODY}" in w for w in warnings)
    assert {fifo, zero} == {n for n in (fifo, zero) for w in warnings if n in w}
    newest = _snapshot_names(store)[-1]
    assert read_manifest(store, newest)["parent"] == mine

    lose_memory(daemon)
    back = cli_measured(daemon, "snapshot", "restore", store, "--lost-only")
    assert back["code"] == PERMISSION, back
    assert back["max_rss"] < RSS_LIMIT
    assert len(one_line_error(back["stderr"])) == 2
    with daemon.client() as c:
        assert c.read("a") == data["a"] and c.info("a")["state"] == "ready"

    # Trusting 65534's files gets past the owner check: then their type refuses them.
    copy = cli_measured(daemon, "snapshot", "restore", store, "--as", "copy", "--trust-uid",
                        str(NOBODY))
    assert copy["code"] == UNCORRECTABLE, copy
    assert copy["max_rss"] < RSS_LIMIT
    errors = one_line_error(copy["stderr"])
    assert len(errors) == 2, errors
    assert any(f"{fifo}/manifest.json is a FIFO, not a snapshot file" in e for e in errors)
    assert any(f"{zero}/manifest.json is a symbolic link, not a snapshot file" in e
               for e in errors), errors
    with daemon.client() as c:
        assert c.read("copy/a") == data["a"]


# ---- item 8: a snapshot directory swapped while it is written ---------------------------------
def _swap_first_snapshot(store: str, decoy: str, known: list[str]) -> str:
    """Wait for root's new snapshot directory and put a symlink to `decoy` in its place."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = [n for n in os.listdir(store) if fmt.NAME_RE.fullmatch(n) and n not in known]
        if new:
            os.rename(os.path.join(store, new[0]), os.path.join(store, "moved"))
            os.symlink(decoy, os.path.join(store, new[0]))
            return new[0]
        time.sleep(0.0005)
    return ""


def test_a_snapshot_directory_swapped_during_create_is_one_line_and_writes_nothing_there(
        daemon, request):
    """A fleet store its group may write (0770, not sticky): a member renames root's new
    snapshot directory away while `snapshot create` writes it and puts a symlink to root's
    own directory in its place. The create ends with one line (exit 10, no traceback), and
    nothing is written into the directory the symlink points to."""
    store = make_store(request, 0o770, group=NOBODY)
    private, files = _private_dir(request)
    fill(daemon, {"big": 256 * MiB})
    known = _snapshot_names(store)
    swapped: dict = {}
    attacker = threading.Thread(target=lambda: swapped.update(name=run_as(
        _swap_first_snapshot, store, private, known, gid=NOBODY)))
    attacker.start()
    try:
        time.sleep(0.2)
        proc = daemon.cli("snapshot", "create", store, timeout=120)
    finally:
        attacker.join(60)
    assert swapped.get("name"), "the attacker never saw the new snapshot directory"
    assert proc.returncode == INVALID_STATE, proc
    errors = one_line_error(proc.stderr)
    assert len(errors) == 1 and "was moved or replaced while it was written" in errors[0], \
        errors
    assert _files_of(private) == files
    assert os.path.islink(os.path.join(store, swapped["name"]))
    # What the create wrote before it found out went where it was written, and is removed.
    for top, _dirs, names in os.walk(os.path.join(store, "moved")):
        assert names == [], (top, names)
