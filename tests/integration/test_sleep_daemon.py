"""Sleep and wake, the daemon's side (issue 28, part 1; daemon/core/sleep.py): the bytes go
to a host tier and the device memory back, reads are served from the tier, what would touch
device memory is refused, a durable allocation asleep survives kill -9 of the daemon and a
keeper restart, wake checks every block against its parity (and repairs it), and only the
process that maps an attachment may say it let go of it. The client's side (parking and
remapping at the same address, the CLI) is tests/integration/test_sleep_client.py's."""
from __future__ import annotations

import errno
import mmap
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import Busy, GpumemError, InvalidState, NotFound
from tests import fakecuda
from tests.harness import wait_for
from tests.users import HeldAs, run_as

MiB = 1 << 20
PERMISSION, BUSY, INVALID = 6, 9, 10


def _store(d, name: str, data: bytes, *extra: str) -> None:
    d.cli("create", name, "--size", str(len(data)), *extra, check=True)
    d.cli("write", name, "-", input=data, check=True)


def _free(c: Client) -> int:
    return c.call("status")["devices"][0]["free"]


def test_sleep_gives_the_memory_back_serves_reads_and_wake_brings_the_bytes(daemon):
    data = os.urandom(6 * MiB)
    _store(daemon, "w", data)
    with daemon.client() as c:
        before = _free(c)
        slept = c.call("sleep", path="w")
        assert slept["bytes"] == len(data) and not slept["already"]
        assert slept["info"]["state"] == "asleep"
        assert _free(c) - before == slept["info"]["capacity"]
        assert c.call("status")["totals"]["asleep_bytes"] == len(data)
        assert c.call("sleep", path="w")["already"]          # a second sleep: nothing
    assert daemon.cli_json("info", "w")["state"] == "asleep"
    assert [e["state"] for e in daemon.cli_json("ls", "-l")] == ["asleep"]
    assert daemon.cli("read", "w", check=True).stdout == data      # from the host tier
    metrics = daemon.cli("metrics", check=True).stdout.decode()
    assert f"gpumemd_asleep_bytes {len(data)}" in metrics
    assert 'gpumemd_allocations{state="asleep"} 1' in metrics
    assert "asleep:" in daemon.cli("status", check=True).stdout.decode()
    with daemon.client() as c:
        woke = c.call("wake", path="w")
        assert woke["info"]["state"] == "ready" and woke["bytes"] == len(data)
        assert woke["verify"]["blocks"] == woke["verify"]["clean"] == len(data) // (128 << 10)
        assert c.call("wake", path="w")["already"]
    assert daemon.cli("read", "w", check=True).stdout == data
    kinds = [e["kind"] for e in daemon.cli_json("events") if e["kind"] in ("sleep", "wake")]
    assert kinds == ["sleep", "wake"]
    daemon.cli("verify", "w", check=0)


def test_what_needs_device_memory_is_refused_while_asleep(daemon):
    _store(daemon, "z", os.urandom(MiB), "--durable")
    with daemon.client() as c:
        c.call("sleep", path="z")
    err = daemon.cli("write", "z", "-", input=b"x", check=INVALID).stderr.decode()
    assert "asleep" in err and "gpumemctl wake z" in err
    daemon.cli("resize", "z", "--size", "2M", check=INVALID)
    daemon.cli("transient", "z", check=INVALID)
    with daemon.client() as c:
        with pytest.raises(InvalidState, match="asleep"):
            c.attach("z", "r")
        assert c.call("info", path="z")["size"] == MiB


@pytest.mark.parametrize("size", [6 * MiB, 24 << 10], ids=["own-memory", "slot"])
def test_a_durable_allocation_asleep_survives_kill9_and_wakes_whole(daemon, size):
    data = os.urandom(size)
    _store(daemon, "d", data, "--durable")
    with daemon.client() as c:
        c.call("sleep", path="d")
    daemon.kill9()
    daemon.start()
    assert daemon.cli_json("info", "d")["state"] == "asleep"
    assert daemon.cli("read", "d", check=True).stdout == data
    assert "clean" in daemon.cli("check", check=True).stdout.decode()
    with daemon.client() as c:
        assert c.call("wake", path="d")["info"]["state"] == "ready"
    daemon.kill9()
    daemon.start()
    assert daemon.cli_json("info", "d")["state"] == "ready"
    assert daemon.cli("read", "d", check=True).stdout == data
    assert "clean" in daemon.cli("check", check=True).stdout.decode()


def test_a_keeper_restart_gets_the_host_copy_again(daemon):
    data = os.urandom(3 * MiB)
    _store(daemon, "k", data, "--durable")
    with daemon.client() as c:
        c.call("sleep", path="k")
    old = daemon.keeper_pid()
    daemon.kill_keeper()
    wait_for(lambda: daemon.keeper_pid() not in (None, old), what="a new keeper")
    wait_for(lambda: "redeposited" in daemon.log(), what="the redeposit")
    daemon.kill9()
    daemon.start()
    assert daemon.cli_json("info", "k")["state"] == "asleep"
    with daemon.client() as c:
        c.call("wake", path="k")
    assert daemon.cli("read", "k", check=True).stdout == data


def test_a_transient_allocation_asleep_goes_with_the_daemon_as_any_transient(daemon):
    _store(daemon, "t", os.urandom(MiB))
    with daemon.client() as c:
        c.call("sleep", path="t")
    daemon.kill9()
    daemon.start()
    daemon.cli("info", "t", check=4)
    assert "clean" in daemon.cli("check", check=True).stdout.decode()


def test_removing_an_asleep_allocation_frees_its_host_copy(daemon):
    _store(daemon, "r", os.urandom(2 * MiB), "--durable")
    with daemon.client() as c:
        c.call("sleep", path="r")
    assert _tier_fds(daemon.proc.pid) >= 1       # (Python's mmap holds a dup of it)
    daemon.cli("rm", "r", check=True)
    wait_for(lambda: _tier_fds(daemon.proc.pid) == 0, what="the host copy freed")
    daemon.kill9()
    daemon.start()
    daemon.cli("info", "r", check=4)
    log = daemon.log()
    assert "clean" in daemon.cli("check", check=True).stdout.decode()
    assert "orphan" not in log.split("serving")[-1]


def _tier_fds(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += "gpumem-asleep:" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return n


def test_wake_repairs_bytes_damaged_in_host_memory(daemon):
    """A byte flipped in the host copy (root writes it through the daemon's fd) is found by
    the check at wake and repaired from the parity that stayed on the device."""
    data = os.urandom(4 * MiB)
    _store(daemon, "h", data)
    with daemon.client() as c:
        c.call("sleep", path="h")
        _flip_tier_byte(daemon.proc.pid, 1_000_000)
        woke = c.call("wake", path="h")
    assert woke["verify"]["corrected"] == 1 and woke["verify"]["uncorrectable"] == 0
    assert woke["info"]["state"] == "ready"
    assert daemon.cli("read", "h", check=True).stdout == data


def _flip_tier_byte(pid: int, offset: int) -> None:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
        except OSError:
            continue
        if "gpumem-asleep:" in target:
            with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                m[offset] ^= 0xFF
            return
    raise AssertionError("no host tier found among the daemon's fds")


def test_a_slot_damaged_in_host_memory_stays_asleep(daemon):
    """A small allocation's host copy is checked by its CRC: a bad one is not woken."""
    data = os.urandom(16 << 10)
    _store(daemon, "s", data)
    with daemon.client() as c:
        c.call("sleep", path="s")
        _flip_tier_byte(daemon.proc.pid, 100)
        with pytest.raises(InvalidState, match="CRC"):
            c.call("wake", path="s")
        assert c.call("info", path="s")["state"] == "asleep"


def test_sleep_is_refused_while_another_process_holds_it(daemon):
    _store(daemon, "b", os.urandom(MiB))
    with daemon.client() as holder:
        handle = holder.call_fds("attach", path="b", mode="r", extents=True)
        for fd in handle[1]:
            os.close(fd)
        err = daemon.cli("sleep", "b", check=BUSY).stderr.decode() \
            if _cli_has_sleep(daemon) else None
        with daemon.client() as other:
            with pytest.raises(Busy, match="attach-r by pid"):
                other.call("sleep", path="b")
        assert err is None or "in use" in err
    assert daemon.cli_json("info", "b")["state"] == "ready"


def _cli_has_sleep(d) -> bool:
    return d.cli("sleep", "--help").returncode == 0


def test_a_parked_attachment_is_remapped_after_wake(daemon):
    """The caller's own attachment, parked, stays held through sleep and wake; op remap
    gives the new memory, refused while asleep."""
    data = os.urandom(2 * MiB)
    _store(daemon, "p", data)
    with daemon.client() as c:
        attached, fds = c.call_fds("attach", path="p", mode="rw", extents=True)
        for fd in fds:
            os.close(fd)
        handle = attached["handle"]
        c.call("sleep", path="p", parked=[handle])
        info = c.call("info", path="p")
        assert info["state"] == "asleep"
        assert [h["parked"] for h in info["holders"]] == [True]
        with pytest.raises(InvalidState, match="asleep"):
            c.call_fds("remap", handle=handle, extents=True)
        c.call("wake", path="p")
        again, fds = c.call_fds("remap", handle=handle, extents=True)
        try:
            assert again["handle"] == handle and len(fds) == 1
            with mmap.mmap(fds[0], again["info"]["capacity"]) as m:
                assert m[:len(data)] == data
        finally:
            for fd in fds:
                os.close(fd)
        assert [h["parked"] for h in c.call("info", path="p")["holders"]] == [False]
        c.call("detach", handle=handle)


def test_another_uid_may_not_sleep_or_wake_what_it_cannot_write(daemon):
    _store(daemon, "mine", os.urandom(MiB), "--mode", "0644")
    got = run_as(_try_sleep, daemon.socket, "mine")
    assert got == ["PermissionDenied", "PermissionDenied"]
    assert daemon.cli_json("info", "mine")["state"] == "ready"


def _try_sleep(sock: str, name: str) -> list[str]:
    out = []
    with Client(sock, timeout=30) as c:
        for op in ("sleep", "wake"):
            try:
                c.call(op, path=name)
                out.append("ok")
            except GpumemError as exc:
                out.append(type(exc).__name__)
    return out


def test_another_uid_cannot_park_a_handle_of_roots_process(daemon):
    """uid 65534 owns a file it lets root attach; it cannot say root's attachment let go of
    its mapping (and so cannot make the daemon free memory root still maps)."""
    run_as(_create_public, daemon.socket)
    with daemon.client() as c:
        attached, fds = c.call_fds("attach", path="pub", mode="r", extents=True)
        for fd in fds:
            os.close(fd)
        got = run_as(_park_foreign, daemon.socket, attached["handle"])
        assert got == "PermissionDenied"
        assert c.call("info", path="pub")["state"] == "ready"


def _create_public(sock: str) -> bool:
    with Client(sock, timeout=30) as c:
        c.create("pub", MiB, mode=0o666)
    return True


def _park_foreign(sock: str, handle: int) -> str:
    with Client(sock, timeout=30) as c:
        try:
            c.call("sleep", path="pub", parked=[handle])
            return "ok"
        except GpumemError as exc:
            return type(exc).__name__


def test_a_holder_elsewhere_keeps_its_mapping_valid(daemon):
    """A process of another uid that maps an allocation (attach) keeps it awake: root's
    sleep is refused while that mapping lives, so its memory is never freed under it."""
    _store(daemon, "shared", os.urandom(MiB), "--mode", "0666")
    with HeldAs(_attach_and_hold, daemon.socket) as held:
        assert held.report == "attached"
        with daemon.client() as c:
            with pytest.raises(Busy):
                c.call("sleep", path="shared")
    with daemon.client() as c:
        wait_for(lambda: not c.call("info", path="shared")["holders"], what="the detach")
        c.call("sleep", path="shared")


def _attach_and_hold(sock: str):
    c = Client(sock, timeout=30)
    _, fds = c.call_fds("attach", path="shared", mode="r", extents=True)
    return "attached", (c, fds)


def test_sleep_and_wake_on_the_cuda_backend(fake_lib, daemon_factory):
    """The cuda backend's copies (one cuMemcpyDtoH and HtoD of a page-locked host tier,
    registered on a worker thread in the device's context) on the fake driver: the device's
    free memory rises, the bytes come back, a durable one survives kill -9 asleep."""
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib))
    data = os.urandom(5 * MiB)
    d.cli("create", "g", "--size", str(len(data)), "--durable", env=d.extra_env, check=True)
    d.cli("write", "g", "-", input=data, env=d.extra_env, check=True)
    with d.client() as c:
        before = _free(c)
        slept = c.call("sleep", path="g")
        assert _free(c) - before >= slept["info"]["capacity"]
    d.kill9()
    d.start()
    assert d.cli("read", "g", env=d.extra_env, check=True).stdout == data
    with d.client() as c:
        woke = c.call("wake", path="g")
    assert woke["verify"]["uncorrectable"] == 0 and woke["verify"]["blocks"] > 0
    assert d.cli("read", "g", env=d.extra_env, check=True).stdout == data
    assert "stays pageable" not in d.log()      # cuMemHostRegister took it


def test_the_mount_reads_an_asleep_file_and_refuses_to_write_it(mounted):
    d = mounted
    data = os.urandom(3 * MiB)
    with open(os.path.join(d.mnt, "m"), "wb") as f:
        f.write(data)
    with d.client() as c:
        c.call("sleep", path="m")
    with open(os.path.join(d.mnt, "m"), "rb") as f:        # from the host tier
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)   # not the page cache
        assert f.read() == data
    with pytest.raises(OSError) as err:
        open(os.path.join(d.mnt, "m"), "r+b")
    assert err.value.errno == errno.EAGAIN
    with d.client() as c:
        c.call("wake", path="m")
    with open(os.path.join(d.mnt, "m"), "r+b") as f:
        f.write(b"new")
    with open(os.path.join(d.mnt, "m"), "rb") as f:
        assert f.read() == b"new" + data[3:]


def test_a_wake_leaves_its_host_memory_for_the_next_sleep(daemon):
    """An engine switching models wakes one and puts another to sleep: the second sleep
    reuses the host memory the wake let go of (made and page-locked already), and reads
    only its own bytes from it, never what the first left past its size."""
    first, second = os.urandom(4 * MiB), os.urandom(4 * MiB - 12345)
    _store(daemon, "one", first)
    _store(daemon, "two", second)
    with daemon.client() as c:
        c.call("sleep", path="one")
        c.call("wake", path="one")
        assert _tier_fds(daemon.proc.pid) >= 1                # kept as a spare
        before = _tier_fds(daemon.proc.pid)
        c.call("sleep", path="two")
        assert _tier_fds(daemon.proc.pid) == before           # the same memfd, reused
        assert c.call("status")["totals"]["asleep_bytes"] == len(second)
    assert daemon.cli("read", "two", check=True).stdout == second
    with daemon.client() as c:
        c.call("wake", path="two")
    assert daemon.cli("read", "two", check=True).stdout == second
    assert daemon.cli("read", "one", check=True).stdout == first


def test_a_snapshot_holds_an_asleep_allocation_read_by_copy(daemon, tmp_path):
    """An engine's model asleep when the snapshot runs is in it (read by copy from the host
    tier), not skipped; restored under another name it has its bytes."""
    data = os.urandom(5 * MiB + 77)
    _store(daemon, "model", data, "--durable")
    with daemon.client() as c:
        c.call("sleep", path="model")
    store = str(tmp_path / "store")
    made = daemon.cli_json("snapshot", "create", store)
    assert [a["path"] for a in made["allocations"]] == ["model"] and not made["skipped"]
    daemon.cli("snapshot", "restore", store, "--as", "back/", check=True)
    assert daemon.cli("read", "back/model", check=True).stdout == data
    assert daemon.cli_json("info", "model")["state"] == "asleep"


def test_a_copy_of_an_asleep_allocation_that_woke_and_changed_is_refused(daemon):
    from gpumemctl.snapshots.bycopy import AsleepHandle
    _store(daemon, "x", os.urandom(MiB))
    with daemon.client() as c:
        c.call("sleep", path="x")
        handle = AsleepHandle(c, "x")
        handle.require_unchanged()                       # nothing happened yet
        c.call("wake", path="x")
        daemon.cli("write", "x", "-", input=b"changed", check=True)
        with pytest.raises(InvalidState, match="woke and changed"):
            handle.require_unchanged()


def test_a_restore_over_an_asleep_allocation_is_refused_until_woken(daemon, tmp_path):
    data = os.urandom(MiB)
    _store(daemon, "r", data, "--durable")
    store = str(tmp_path / "store")
    daemon.cli("snapshot", "create", store, check=True)
    with daemon.client() as c:
        c.call("sleep", path="r")
    err = daemon.cli("snapshot", "restore", store, "--force", check=INVALID).stderr.decode()
    assert "asleep" in err and "wake" in err
    assert daemon.cli("read", "r", check=True).stdout == data
    with daemon.client() as c:
        c.call("wake", path="r")
    daemon.cli("snapshot", "restore", store, "--force", check=True)
    assert daemon.cli("read", "r", check=True).stdout == data


def test_a_parked_writer_seals_and_detaches_while_asleep(daemon):
    """A writer's parity is encoded as its allocation goes to sleep: its seal, or its
    detach, while asleep commits without touching device memory, and the wake is clean."""
    data = os.urandom(3 * MiB)
    _store(daemon, "w", data, "--durable")
    with daemon.client() as c:
        attached, fds = c.call_fds("attach", path="w", mode="rw", extents=True)
        for fd in fds:
            os.close(fd)
        c.call("sleep", path="w", parked=[attached["handle"]])
        assert c.call("seal", path="w")["unsealed"] is False
        c.call("detach", handle=attached["handle"])
        info = c.call("info", path="w")
        assert info["state"] == "asleep" and info["holders"] == []
        woke = c.call("wake", path="w")
    assert woke["verify"]["clean"] == woke["verify"]["blocks"] > 0
    assert daemon.cli("read", "w", check=True).stdout == data


def test_a_snapshot_copy_never_reads_another_allocation_under_the_name(daemon):
    """Root's snapshot reads an asleep allocation piece by piece, by path; its owner
    renaming another allocation into that name between two pieces (and back) must not get
    the other's bytes recorded under the entry: each piece names the id it began with."""
    from gpumemctl.snapshots.bycopy import AsleepHandle
    _store(daemon, "x", os.urandom(MiB))
    _store(daemon, "other", os.urandom(MiB))
    with daemon.client() as c:
        c.call("sleep", path="x")
        handle = AsleepHandle(c, "x")
        c.call("rename", path="x", to="x.away")
        c.call("rename", path="other", to="x")       # the name now another's
        with pytest.raises(NotFound, match="another allocation"):
            handle.memory.drain(0, MiB, lambda at, view: None)
