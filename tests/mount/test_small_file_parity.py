"""The parity of small files written through the mount (issue 26, docs/ecc.md): a close
leaves it to a pass that encodes each 128 KiB block of a slab once for the files written in
it. What a user must still observe: verify judges every file once it is settled (and finds
damage in it), fsync settles before it answers, a kill -9 with files pending loses nothing
and leaves nothing that verify takes for damage, a removal leaves the block's neighbours
verifiable, and a clean stop leaves nothing pending."""
from __future__ import annotations

import json
import os
import time

import pytest

from tests.harness import wait_for

KiB = 1 << 10
FILES = 100                    # about three blocks of 4 KiB slots
PASS_SECONDS = 1.0             # the mount's pass runs every 0.2 s (daemon/fs/mount.py)


@pytest.fixture
def d(mounted_factory):
    """A mount whose memory a test may damage (`gpumemctl debug corrupt`)."""
    daemon = mounted_factory(extra_args=["--enable-fault-injection"])
    daemon.allow_errors = True          # damage found is logged at ERROR, on purpose
    return daemon


def write_files(root: str, count: int = FILES, size: int = 4 * KiB,
                prefix: str = "f") -> dict[str, bytes]:
    """`count` new files of random bytes (open, write, close: as tar does)."""
    os.makedirs(root, exist_ok=True)
    written = {}
    for i in range(count):
        path = os.path.join(root, f"{prefix}{i:03d}")
        data = os.urandom(size)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        written[path] = data
    return written


def same_bytes(written: dict[str, bytes]) -> None:
    for path, data in written.items():
        with open(path, "rb") as f:
            assert f.read() == data, path


def verify(d, *names: str):
    result = d.cli("verify", *(names or ("--all",)), "--json")
    return result.returncode, json.loads(result.stdout)


def totals(report: dict) -> dict:
    keys = ("blocks", "clean", "skipped", "corrected", "uncorrectable")
    return {k: sum(a[k] for a in report["allocations"]) for k in keys}


def corrupt(d, name: str, offset: int = 100, length: int = 64) -> None:
    d.cli("debug", "corrupt", name, "--offset", str(offset), "--length", str(length),
          "--pattern", "a5", check=True)


def make_durable(path: str) -> None:
    os.setxattr(path, "user.gpu.durable", b"true")


def wait_released(paths) -> None:
    """close(2) does not wait for the kernel's release, which commits the size: wait until
    the daemon has had each (only the durable pin holds it)."""
    for path in paths:
        wait_for(lambda p=path: os.getxattr(p, "user.gpu.refcount") == b"1",
                 what=f"the release of {path}")


def test_many_small_files_verify_clean_and_every_block_is_judged(d):
    written = write_files(os.path.join(d.mnt, "t"))
    rc, report = verify(d)                      # at once: verify settles what is pending
    assert rc == 0, report
    sums = totals(report)
    assert sums["skipped"] == 0 and sums["clean"] == sums["blocks"] == FILES, sums
    time.sleep(PASS_SECONDS)
    rc, report = verify(d)
    assert rc == 0 and totals(report)["clean"] == FILES, report
    same_bytes(written)
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def test_damage_in_a_small_file_settled_by_the_pass_is_found(d):
    """No verify in between: only the mount's own pass can have settled the parity; had it
    not, the verify would encode over the damage first and find nothing."""
    written = write_files(os.path.join(d.mnt, "t"))
    time.sleep(PASS_SECONDS)
    corrupt(d, "t/f010")
    rc, report = verify(d, "t/f010")
    assert rc == 8, report
    rc, report = verify(d, "--all")             # the other blocks are clean
    assert rc == 8 and totals(report)["clean"] >= FILES - 32, report
    # (verify without --repair recorded the block's damage in all 32 of its files)
    assert d.cli("verify", "--all", "--repair").returncode == 1
    same_bytes(written)


def test_damage_after_a_verify_settled_the_parity_is_found(d):
    written = write_files(os.path.join(d.mnt, "t"))
    assert verify(d)[0] == 0
    corrupt(d, "t/f050", offset=0, length=4096)
    assert verify(d, "t/f050")[0] == 8
    assert d.cli("verify", "--all", "--repair").returncode == 1
    same_bytes(written)


@pytest.mark.parametrize("closed", [False, True], ids=["open", "closed"])
def test_fsync_settles_the_parity_before_it_answers(d, closed):
    """Damage right after fsync(2) is found: fsync encoded the file's block itself."""
    write_files(os.path.join(d.mnt, "t"), count=10)        # neighbours, pending
    path = os.path.join(d.mnt, "t", "synced")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, os.urandom(4 * KiB))
        os.fsync(fd)
        if closed:
            os.close(fd)
        corrupt(d, "t/synced", offset=1000, length=32)
        rc, report = verify(d, "t/synced")
        assert rc == 8, report
    finally:
        if not closed:
            os.close(fd)


def test_kill9_with_pending_durable_small_files_keeps_their_bytes(d):
    """Durable files rewritten and closed just before a kill -9 carry the WRITING mark
    while their parity is pending: the start rebuilds their blocks from the data."""
    root = os.path.join(d.mnt, "t")
    written = write_files(root)
    for path in written:
        make_durable(path)
    written = write_files(root)                 # the same names again: rewritten
    wait_released(written)
    d.kill9()
    d.start()
    same_bytes(written)
    rc, report = verify(d)
    assert rc == 0 and totals(report)["clean"] == FILES, report
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def test_kill9_with_pending_transient_files_beside_durable_ones(d):
    """Transient files written into the blocks of durable ones, then a kill -9: the
    transient ones are gone, and the durable neighbours verify clean (a transient file
    beside a durable one is encoded at its close, not left pending)."""
    root = os.path.join(d.mnt, "t")
    durable = write_files(root, count=40, prefix="d")
    assert verify(d)[0] == 0
    for path in durable:
        make_durable(path)
    wait_released(durable)
    transient = write_files(root, count=40, prefix="x")
    d.kill9()
    d.start()
    assert not any(os.path.exists(p) for p in transient)
    same_bytes(durable)
    rc, report = verify(d)
    assert rc == 0 and totals(report)["clean"] == 40, report


def test_removing_pending_files_leaves_their_neighbours_verifiable(d):
    root = os.path.join(d.mnt, "t")
    written = write_files(root)
    gone = [p for i, p in enumerate(written) if i % 3 == 0]
    for path in gone[::2]:
        os.unlink(path)                          # in the mount
    for path in gone[1::2]:                      # through the socket
        d.cli("rm", os.path.relpath(path, d.mnt), check=True)
    kept = {p: b for p, b in written.items() if p not in gone}
    rc, report = verify(d)
    assert rc == 0 and totals(report)["clean"] == len(kept), report
    again = write_files(root, count=len(gone), prefix="n")   # into the slots given back
    assert verify(d)[0] == 0
    same_bytes(kept)
    same_bytes(again)


def test_chown_of_a_pending_file_moves_it_out_of_its_slab_verifiable(d):
    root = os.path.join(d.mnt, "t")
    written = write_files(root, count=20)
    moved = next(iter(written))
    os.chown(moved, 1000, 1000)
    rc, report = verify(d)
    assert rc == 0 and totals(report)["skipped"] == 0, report
    same_bytes(written)


def test_a_clean_stop_leaves_no_parity_pending(d):
    """Durable files closed just before SIGTERM: the stop settles them, so the next start
    finds no writes in flight and rebuilds nothing."""
    root = os.path.join(d.mnt, "t")
    written = write_files(root)
    for path in written:
        make_durable(path)
    written = write_files(root)
    wait_released(written)
    assert d.stop() == 0
    d.start()
    rebuilt = [e for e in d.cli_json("events", "--limit", "100000")
               if e["kind"] == "parity"]
    assert rebuilt == [], rebuilt
    same_bytes(written)
    rc, report = verify(d)
    assert rc == 0 and totals(report)["clean"] == FILES, report
