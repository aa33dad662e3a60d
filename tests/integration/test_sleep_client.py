"""Sleep and wake from the client's side (issue 28, part 1), on the host backend against a real
gpumemd: `Client.sleep` parks this process's attachments (the address range kept, nothing
mapped) and `Client.wake` maps the new memory at the same address, so that a pointer or a
numpy array made before the sleep sees the same bytes after the wake; the CLI's
`gpumemctl sleep|wake`; what another process and another uid cannot do; the tensors of
gpumemctl.tensors.load; and CudaMemory's park/remap on the fake CUDA driver (tests/fakecuda).
The daemon's side (its states, the host tier, a kill -9 while asleep) is
tests/integration/test_sleep_daemon.py's; a GPU's, tests/gpu/test_sleep_cuda.py's.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import io
import json
import os
import signal
import subprocess
import textwrap

import numpy as np
import pytest
from safetensors.numpy import save_file

import gpumemctl
import gpumemctl.cli.typerapp  # every command's module, loaded before run_as drops root
import gpumemctl.protocol.owners  # an error's user names, as above
import gpumemctl.sleepwake  # Client.sleep's module, as above
import gpumemctl.tensors
from gpumemctl.cli import run as cli_run
from gpumemctl.protocol import Busy, GpumemError, InvalidState, NotFound, PermissionDenied
from tests import fakecuda
from tests.harness import PYTHON, ROOT, child_env, wait_for
from tests.integration.test_cuda_fake import ok, run_py
from tests.users import NOBODY, run_as

MiB = 1 << 20
BUSY, PERMISSION, INVALID = Busy.code, PermissionDenied.code, InvalidState.code
assert (BUSY, PERMISSION, INVALID) == (9, 6, 10)


def pattern(n: int, seed: int = 1) -> bytes:
    return hashlib.shake_256(seed.to_bytes(4, "little")).digest(n)


def made(d, name: str, size: int, seed: int = 1, *extra: str) -> bytes:
    """`name` created through the CLI and filled with a pattern; returns it."""
    data = pattern(size, seed)
    d.cli("create", name, "--size", str(size), *extra, check=True)
    d.cli("write", name, "-", input=data, check=True)
    return data


def state(d, name: str) -> str:
    return d.cli_json("info", name)["state"]


def holder_process(d, name: str, mode: str = "r") -> subprocess.Popen:
    """Another process holding an attachment of `name` until killed."""
    code = textwrap.dedent("""
        import sys, time, gpumemctl
        a = gpumemctl.attach(sys.argv[2], sys.argv[3], sys.argv[1])
        print("READY", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([PYTHON, "-c", code, d.socket, name, mode], env=child_env(),
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# ---- an attachment across a sleep and a wake ----------------------------------------------------
def test_an_attachment_keeps_its_address_and_bytes_across_sleep_and_wake(daemon):
    size = 3 * MiB + 5                     # memory of its own, not a slot in a slab
    daemon.cli("create", "m/w", "--size", str(size), check=True)
    data = pattern(size)
    with daemon.client() as c:
        a = c.attach("m/w", "rw")
        a.write(data)
        arr = np.from_dlpack(a)            # made before the sleep: the same address after
        ptr = a.ptr
        slept = c.sleep("m/w")
        assert [(r["info"]["state"], r["bytes"], r["already"]) for r in slept] == \
            [("asleep", size, False)]
        assert a.parked and a.ptr == ptr and "parked" in repr(a)
        for touch in (lambda: a.read(0, 4), lambda: a.write(b"x"), a.__dlpack__,
                      lambda: a.__array_interface__):
            with pytest.raises(InvalidState, match="'m/w' is asleep"):
                touch()
        assert [e["state"] for e in daemon.cli_json("ls", "m")] == ["asleep"]
        holders = c.info("m/w")["holders"]
        assert [(h["kind"], h["parked"]) for h in holders] == [("attach-w", True)]
        assert c.sleep(["m/w"])[0]["already"] is True        # asleep already: nothing done

        woke = c.wake("m/w")[0]
        assert (woke["info"]["state"], woke["bytes"], woke["already"]) == ("ready", size, False)
        assert woke["verify"]["blocks"] > 0 and woke["verify"]["uncorrectable"] == 0
        assert not a.parked and a.ptr == ptr
        assert ctypes.string_at(ptr, size) == data
        assert arr.tobytes() == data
        a.write(b"again")                  # writes work again, through the same pointer
        assert arr[:5].tobytes() == b"again" and a.read(0, 5) == b"again"
        assert [h["parked"] for h in c.info("m/w")["holders"]] == [False]
        assert c.wake("m/w")[0]["already"] is True
        del arr
        a.detach()
    assert daemon.cli("read", "m/w", check=True).stdout == b"again" + data[5:]


def test_a_slot_of_a_slab_keeps_its_address_on_the_host_backend(daemon):
    data = made(daemon, "small", 5000)
    with daemon.client() as c, c.attach("small", "r") as a:
        assert "region" in a.info          # a slot: mapped at its offset in the slab's memfd
        ptr, arr = a.ptr, np.from_dlpack(a)
        c.sleep("small")
        c.wake("small")
        assert a.ptr == ptr and arr.tobytes() == data == a.read()
        del arr


def test_park_and_resume_by_hand_and_detach_while_parked(daemon):
    made(daemon, "p", 2 * MiB)
    with daemon.client() as c:
        a = c.attach("p", "r")
        assert a.park() == a.park()        # idempotent: the holder id, for op sleep
        a.resume()                         # awake: the same memory, mapped again
        assert not a.parked and a.read(0, 8) == pattern(8)
        gpumemctl.sleep("p", daemon.socket)     # another connection: the registry finds it
        assert a.parked
        with pytest.raises(InvalidState, match="is asleep"):
            a.resume()                     # asleep: the daemon says to wake it first
        daemon.cli("wake", "p", check=True)     # woken by another: still parked here
        assert a.parked
        assert c.wake("p")[0]["already"] is True and not a.parked
        assert a.read(0, 8) == pattern(8)
        gpumemctl.sleep(["p"], daemon.socket)
        a.detach()                         # a parked attachment detaches: only the range goes
        assert a.detached and c.info("p")["holders"] == []
        assert state(daemon, "p") == "asleep"
        assert gpumemctl.wake(["p"], daemon.socket)[0]["info"]["state"] == "ready"
    assert daemon.cli("read", "p", check=True).stdout == pattern(2 * MiB)


# ---- what is refused -----------------------------------------------------------------------------
def test_another_process_cannot_sleep_what_this_one_has_attached(daemon):
    made(daemon, "held", 2 * MiB)
    with gpumemctl.attach("held", "r", daemon.socket) as a:
        err = daemon.cli("sleep", "held", check=BUSY).stderr.decode()
        assert "in use (attach-r by pid" in err and len(err.strip().splitlines()) == 1
        assert state(daemon, "held") == "ready" and not a.parked


def test_a_refused_sleep_maps_back_what_it_parked(daemon):
    data = made(daemon, "shared", 2 * MiB)
    other = holder_process(daemon, "shared")
    try:
        with daemon.client() as c, c.attach("shared", "r") as a:
            ptr = a.ptr
            with pytest.raises(Busy, match=f"attach-r by pid {other.pid}"):
                c.sleep("shared")
            assert not a.parked and a.ptr == ptr and a.read() == data
            assert [h["parked"] for h in c.info("shared")["holders"]] == [False, False]
    finally:
        stop(other)
    assert state(daemon, "shared") == "ready"


def cli_as(sock: str, *args: str) -> dict:
    """`gpumemctl --socket SOCK ARGS` in this (run_as, forked) process: exit code, output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_run(["--socket", sock, *args])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _as_other(sock: str, handle: int) -> dict:
    """What another uid gets: op sleep naming this test's attachment as parked, op remap
    of it, and Client.sleep while the attachment is held (this forked child inherited the
    attachment in its registry: it is its parent's, not the child's to park)."""
    def code(fn, *args, **kw):
        try:
            fn(*args, **kw)
        except GpumemError as exc:
            return exc.code
        return 0
    with gpumemctl.Client(sock) as c:
        return {"private": cli_as(sock, "sleep", "o/private"),
                "park_mine": code(c.call, "sleep", path="o/open", parked=[handle]),
                "remap_mine": code(c.call_fds, "remap", handle=handle, regions=True,
                                   extents=True),
                "sleep_held": code(c.sleep, "o/open")}


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_another_uid_sleeps_nothing_of_others_and_speaks_for_no_other_mapping(daemon):
    made(daemon, "o/private", 2 * MiB)                      # 0600: root's alone
    data = made(daemon, "o/open", 2 * MiB, 2, "--mode", "0666")
    with daemon.client() as c, c.attach("o/open", "r") as a:
        got = run_as(_as_other, daemon.socket, a._holder, uid=NOBODY, gid=NOBODY)
        assert got["private"]["code"] == PERMISSION, got
        assert "permission denied" in got["private"]["stderr"]
        assert got["park_mine"] == PERMISSION                # not its process's attachment
        assert got["remap_mine"] in (NotFound.code, PERMISSION)     # nor its session's
        assert got["sleep_held"] == BUSY
        assert not a.parked and a.read() == data
    assert state(daemon, "o/private") == "ready" and state(daemon, "o/open") == "ready"


# ---- the command line ----------------------------------------------------------------------------
def test_cli_sleep_and_wake_round_trip_bytes_and_carry_on_past_a_bad_name(daemon):
    a, b = made(daemon, "c/a", 3 * MiB, 1), made(daemon, "c/b", 4096, 2)
    proc = daemon.cli("sleep", "c/a", "c/nope", "c/b", check=NotFound.code)
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[0].startswith("sleep c/a: 3M to host memory in ")
    assert lines[0].endswith(" GB/s)") and lines[1].startswith("sleep c/b: 4K to host memory")
    assert "c/nope" in proc.stderr.decode()
    assert [state(daemon, n) for n in ("c/a", "c/b")] == ["asleep", "asleep"]
    assert daemon.cli("read", "c/a", check=True).stdout == a        # by copy, from host memory
    assert daemon.cli("sleep", "c/a", check=True).stdout == b"sleep c/a: already asleep\n"
    replies = json.loads(daemon.cli("sleep", "c/a", "c/nope", "--json", check=4).stdout)
    assert replies[0]["already"] is True and replies[0]["info"]["path"] == "c/a"
    assert (replies[1]["name"], replies[1]["error"]["code"]) == ("c/nope", NotFound.code)

    lines = daemon.cli("wake", "c/a", "c/b", check=True).stdout.decode().splitlines()
    assert lines[0].startswith("wake c/a: 3M back in ") and \
        lines[0].endswith(" blocks verified"), lines
    assert daemon.cli("read", "c/a", check=True).stdout == a
    assert daemon.cli("read", "c/b", check=True).stdout == b
    assert daemon.cli("wake", "c/b", check=True).stdout == b"wake c/b: already awake\n"

    slept = daemon.cli_json("sleep", "c/a")
    assert [(r["info"]["state"], r["bytes"], r["already"]) for r in slept] == \
        [("asleep", 3 * MiB, False)] and r_keys(slept) >= {"info", "bytes", "seconds", "already"}
    woke = daemon.cli_json("wake", "c/a")
    assert r_keys(woke) >= {"info", "bytes", "seconds", "already", "verify"}
    assert set(woke[0]["verify"]) >= {"blocks", "clean", "corrected", "uncorrectable"}
    assert woke[0]["verify"]["blocks"] == woke[0]["verify"]["clean"] > 0
    assert daemon.cli("read", "c/a", check=True).stdout == a


def r_keys(replies: list[dict]) -> set[str]:
    assert len(replies) == 1
    return set(replies[0])


def test_cli_sleep_of_a_directory_is_one_line_and_an_error(daemon):
    made(daemon, "d/x", 4096)
    proc = daemon.cli("sleep", "d")
    err = proc.stderr.decode()
    assert proc.returncode not in (0, 70) and len(err.strip().splitlines()) == 1, err
    assert state(daemon, "d/x") == "ready"


# ---- gpumemctl.tensors ---------------------------------------------------------------------------
def test_tensors_of_a_sharded_model_survive_sleep_and_wake_in_place(daemon, tmp_path):
    rng = np.random.default_rng(3)
    shards = {"model-1.safetensors": {"big": rng.standard_normal((600, 700), np.float32)},
              "model-2.safetensors": {"small": np.arange(10, dtype=np.int64),
                                      "half": rng.standard_normal(33).astype(np.float16)}}
    src = tmp_path / "model"
    src.mkdir()
    for file, tensors in shards.items():
        save_file(tensors, str(src / file))
    daemon.cli("load", str(src), "models/sh", check=True)
    want = {k: v for tensors in shards.values() for k, v in tensors.items()}
    w = gpumemctl.tensors.load("models/sh", framework="numpy", socket=daemon.socket)
    ptrs = {k: v.ctypes.data for k, v in w.items()}
    names = w.index.shards
    assert len(names) == 2
    with daemon.client() as c:
        assert [r["already"] for r in c.sleep(names)] == [False, False]
        assert all(a.parked for a in w.attachments)
        assert {state(daemon, n) for n in names} == {"asleep"}
        c.wake(names)
    assert {k: v.ctypes.data for k, v in w.items()} == ptrs
    for k, v in want.items():
        assert w[k].tobytes() == v.tobytes(), k
    assert [r["info"]["state"] for r in w.sleep()] == ["asleep", "asleep"]
    assert [r["info"]["state"] for r in w.wake()] == ["ready", "ready"]
    assert all(w[k].tobytes() == v.tobytes() for k, v in want.items())
    del w
    gc.collect()
    with daemon.client() as c:
        wait_for(lambda: all(c.info(n)["holders"] == [] for n in names),
                 what="the tensors' attachments to go")


# ---- the fake CUDA driver: CudaMemory.park/remap -------------------------------------------------
CUDA_PARK = """
    from gpumemctl import cudadrv
    from gpumemctl.memory import CudaMemory
    from gpumemctl.protocol import InternalError, InvalidState
    g = cudadrv.granularity(0)
    info = {"path": "x", "device": "0", "capacity": 2 * g}

    def memory(text):
        h = cudadrv.mem_create(2 * g, 0)
        m = CudaMemory([cudadrv.export_fd(h)], info, True)
        m.write(0, text)
        m.close()              # the imported handle goes; the creator's keeps the memory
        return h

    first, second = memory(b"first"), memory(b"second")
    m = CudaMemory([cudadrv.export_fd(first)], info, True)
    ptr = m.ptr
    m.park()
    assert m.mapping.parked and m.ptr == ptr
    bigger = cudadrv.mem_create(4 * g, 0)
    try:
        m.remap([cudadrv.export_fd(bigger)], {**info, "capacity": 4 * g})
    except InternalError as exc:
        print("size refused:", "bytes for a mapping of" in str(exc))
    assert m.mapping.parked
    m.remap([cudadrv.export_fd(second)], info)
    print(m.ptr == ptr, m.read(0, 6))
    m.write(0, b"SECOND")
    m.park()
    m.close()                  # parked: only the range is freed
    m = CudaMemory([cudadrv.export_fd(second)], info, False)
    print(m.read(0, 6))
    m.close()
    slot = CudaMemory([cudadrv.export_fd(first)],
                      {**info, "capacity": 4096, "region": {"offset": 8192, "span": 2 * g}},
                      False)
    try:
        slot.park()
    except InvalidState as exc:
        print("slot refused:", "slab" in str(exc))
    print(slot.read(0, 5))
"""


def test_cuda_memory_parks_and_remaps_at_the_same_address_on_the_fake_driver(fake_lib):
    proc = subprocess.run([PYTHON, "-c", textwrap.dedent(CUDA_PARK)], capture_output=True,
                          text=True, env=child_env(fakecuda.env(fake_lib)), cwd=ROOT,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["size refused: True", "True b'second'", "b'SECOND'",
                                        "slot refused: True", "b'\\x00\\x00\\x00\\x00\\x00'"]


CUDA_SLEEP = """
    import ctypes, gpumemctl
    from gpumemctl.protocol import InvalidState
    with gpumemctl.Client(SOCK) as c:
        a = c.attach("big", "rw")
        ptr = a.ptr
        a.write(b"before sleep")
        c.sleep("big")
        print(a.parked, c.info("big")["state"])
        c.wake("big")
        print(a.ptr == ptr, ctypes.string_at(ptr, 12), a.read(0, 12))
        a.detach()
        s = c.attach("small", "r")
        try:
            c.sleep("small")
        except InvalidState as exc:
            print("slot refused:", "slab" in str(exc))
        print(s.parked, s.read(0, 5), c.info("small")["state"])
        s.detach()
        c.sleep("small")            # nothing attached: a packed allocation sleeps and wakes
        print(c.wake("small")[0]["info"]["state"])
"""


def test_an_attachment_keeps_its_address_on_the_cuda_backend_of_the_fake_driver(
        fake_lib, daemon_factory):
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib))
    d.cli("create", "big", "--size", str(3 * MiB), env=d.extra_env, check=True)
    d.cli("create", "small", "--size", "4096", env=d.extra_env, check=True)
    d.cli("write", "small", "-", input=b"tiny!", env=d.extra_env, check=True)
    assert ok(run_py(d, CUDA_SLEEP)).splitlines() == [
        "True asleep", "True b'before sleep' b'before sleep'", "slot refused: True",
        "False b'tiny!' ready", "ready"]
