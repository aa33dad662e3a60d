"""The cuda backend end to end on a fake CUDA driver (tests/fakecuda), on any Linux machine.

The fake libcuda.so.1 stands in for the NVIDIA driver with host memory (memfds, mmap,
mprotect), and the real cuda.bindings package talks to it. So these tests run every call
gpumemctl.cudadrv makes, with the argument types and return tuples of the real bindings,
through the daemon's CudaBackend, the client's import/map/staged-copy path and attach(). What
they cannot show is how a real GPU behaves: that is tests/gpu (docs/cuda.md).

Client code that loads CUDA runs in child processes with LD_LIBRARY_PATH pointing at the
fake; the test process itself never loads it.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import textwrap

import pytest

from tests import fakecuda
from tests.harness import PYTHON, ROOT, child_env, script_argv, wait_for
from tests.sizes import with_parity

MiB = 1 << 20
FAKE_UUID0 = "GPU-fa4ec0da-1234-4000-8000-000000000000"
FAKE_UUID1 = "GPU-fa4ec0da-1234-4000-8000-000000000001"


@pytest.fixture
def cuda_daemon(fake_lib, daemon_factory):
    return daemon_factory(backend="cuda", env=fakecuda.env(fake_lib))


def cli(d, *args, **kw):
    return d.cli(*args, env=d.extra_env, **kw)


def cli_json(d, *args):
    return json.loads(cli(d, *args, "--json", check=True).stdout)


def run_py(d, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run client code against daemon `d` in a child that loads the fake driver; the
    code sees SOCK (the daemon's socket) and ARGS."""
    prelude = f"import sys\nSOCK = {d.socket!r}\nARGS = sys.argv[1:]\n"
    return subprocess.run([PYTHON, "-c", prelude + textwrap.dedent(code), *args],
                          capture_output=True, text=True, env=child_env(d.extra_env),
                          timeout=timeout, cwd=ROOT)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def gpumemd(fake_lib, tmp_path, *args, **settings) -> subprocess.CompletedProcess:
    """Run gpumemd in the foreground just long enough to start or refuse."""
    return subprocess.run(script_argv("gpumemd") + ["--socket", str(tmp_path / "s"), "--state-dir",
                                             str(tmp_path / "st"), *args],
                          env=child_env(fakecuda.env(fake_lib, **settings)), capture_output=True,
                          text=True, timeout=30)


# ---- choosing the backend -----------------------------------------------------------------------
def test_auto_picks_cuda_and_says_why(fake_lib, daemon_factory):
    d = daemon_factory(backend="auto", env=fakecuda.env(fake_lib))
    assert d.client().hello["backend"] == "cuda"
    assert "backend cuda chosen (auto: 2 CUDA device(s) with VMM and POSIX-fd handles" in d.log()


def test_auto_falls_back_to_host_and_says_why(fake_lib, daemon_factory):
    d = daemon_factory(backend="auto", env=fakecuda.env(fake_lib, FAKECUDA_NO_VMM="1"))
    assert d.client().hello["backend"] == "host"
    assert "backend host chosen (auto: no usable CUDA device: device 0 (Fake GPU 0 (host " \
           "memory)) lacks VMM and POSIX-fd handles" in d.log()


@pytest.mark.parametrize("settings, why", [
    ({"FAKECUDA_NO_VMM": "1"}, "lacks VMM and POSIX-fd handles"),
    ({"FAKECUDA_DEVICES": "0"}, "CUDA_ERROR_NO_DEVICE"),
])
def test_backend_cuda_refuses_to_start_without_a_usable_device(fake_lib, tmp_path, settings,
                                                              why):
    proc = gpumemd(fake_lib, tmp_path, "--backend", "cuda", **settings)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpumemd: --backend cuda: no usable CUDA device") and why in last
    assert "Traceback" not in proc.stderr


# ---- devices, create, out of memory -------------------------------------------------------------
@pytest.mark.slabs_off
def test_devices_report_the_driver_granularity_and_uuids(cuda_daemon):
    devs = cli_json(cuda_daemon, "devices")
    assert [(d["index"], d["uuid"], d["granularity"], d["backend"]) for d in devs] == \
        [(0, FAKE_UUID0, 2 * MiB, "cuda"), (1, FAKE_UUID1, 2 * MiB, "cuda")]
    assert devs[1]["total"] == 4 << 30 and 0 < devs[1]["free"] <= devs[1]["total"]
    info = cli_json(cuda_daemon, "create", "a", "--size", "3M", "--device", FAKE_UUID1.lower())
    assert (info["size"], info["capacity"], info["device"]) == (3 * MiB, 4 * MiB, FAKE_UUID1)
    info = cli_json(cuda_daemon, "create", "b", "--size", "1", "--device", "0")
    assert (info["capacity"], info["device"]) == (2 * MiB, FAKE_UUID0)
    after = {d["index"]: d for d in cli_json(cuda_daemon, "devices")}
    # ECC on (the default): each holds a 2 MiB parity region beside its data
    assert after[1]["ours"] == with_parity(4 * MiB) and after[0]["ours"] == with_parity(2 * MiB)
    assert after[1]["free"] == devs[1]["free"] - with_parity(4 * MiB)
    err = cli(cuda_daemon, "create", "c", "--size", "1M", "--device", "7", check=4).stderr
    assert b"no device '7'" in err


def test_over_large_request_fails_cleanly_and_the_daemon_keeps_serving(cuda_daemon):
    proc = cli(cuda_daemon, "create", "huge", "--size", "5G", "--device", "1", check=7)
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert f"out of memory on device 1 ({FAKE_UUID1})" in err
    assert "free" in err and "5368709120 bytes) requested" in err
    cli(cuda_daemon, "create", "small", "--size", "1M", check=True)
    assert [e["path"] for e in cli_json(cuda_daemon, "ls")] == ["small"]


# ---- data through the CLI -----------------------------------------------------------------------
def test_cli_write_and_read_round_trip_in_several_staged_chunks(cuda_daemon, tmp_path):
    size = 200 * MiB + 12345           # four 64 MiB staging chunks and a ragged tail
    data = os.urandom(size)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    cli(cuda_daemon, "create", "big", "--size", str(size), "--device", "1", check=True)
    cli(cuda_daemon, "write", "big", str(src), check=True)
    out = cli(cuda_daemon, "read", "big", timeout=120, check=True).stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
    cli(cuda_daemon, "read", "big", str(tmp_path / "out.bin"), timeout=120, check=True)
    assert hashlib.sha256((tmp_path / "out.bin").read_bytes()).digest() == \
        hashlib.sha256(data).digest()               # a regular file: written in parallel
    with open(tmp_path / "app.bin", "wb") as f:     # O_APPEND after a prefix: sequential
        f.write(b"prefix")
    with open(tmp_path / "app.bin", "ab") as f:
        subprocess.run(script_argv("gpumemctl") + ["--socket", cuda_daemon.socket, "read", "big",
                                            "--length", str(65 * MiB)],
                       stdout=f, env=child_env(cuda_daemon.extra_env), check=True, timeout=120)
    assert (tmp_path / "app.bin").read_bytes() == b"prefix" + data[:65 * MiB]
    part = cli(cuda_daemon, "read", "big", "--offset", str(70 * MiB - 3), "--length", "4099",
               check=True).stdout
    assert part == data[70 * MiB - 3:70 * MiB + 4096]
    cli(cuda_daemon, "write", "big", "--offset", "100", input=b"patched", check=True)
    assert cli(cuda_daemon, "read", "big", "--length", "110", check=True).stdout == \
        data[:100] + b"patched" + data[107:110]
    err = cli(cuda_daemon, "write", "big", "--offset", str(size - 2), input=b"abc",
              check=2).stderr
    assert b"input is larger than 'big'" in err


def test_ls_on_the_cuda_backend_does_not_load_cuda(cuda_daemon):
    cli(cuda_daemon, "create", "x", "--size", "1M", check=True)
    code = """
        sys.argv = ['gpumemctl', '--socket', SOCK, 'ls', '-l']
        from gpumemctl.cli import main
        try:
            main()
        except SystemExit as e:
            assert e.code == 0, e.code
        sys.stderr.write(str([m for m in sys.modules if m.split('.')[0] == 'cuda']))
    """
    proc = run_py(cuda_daemon, code)
    assert ok(proc) and proc.stderr.strip() == "[]"


# ---- durability ---------------------------------------------------------------------------------
def test_kill9_of_the_daemon_readopts_durable_memory_byte_identical(cuda_daemon, tmp_path):
    sizes = {"m/a": 5 * MiB + 3, "m/b": 4096, "m/c": 2 * MiB}
    data = {}
    for i, (name, size) in enumerate(sizes.items()):
        data[name] = hashlib.shake_256(bytes([i])).digest(size)
        (tmp_path / "f").write_bytes(data[name])
        cli(cuda_daemon, "create", name, "--size", str(size), "--durable", "--device",
            str(i % 2), check=True)
        cli(cuda_daemon, "write", name, str(tmp_path / "f"), check=True)
    cli(cuda_daemon, "create", "scratch", "--size", "1M", check=True)
    before = {e["path"]: e for e in cli_json(cuda_daemon, "ls", "-R")}
    cuda_daemon.kill9()
    cuda_daemon.start()
    for name, expected in data.items():
        assert cli(cuda_daemon, "read", name, check=True).stdout == expected, name
    after = {e["path"]: e for e in cli_json(cuda_daemon, "ls", "-R")}
    assert set(after) == set(before) - {"scratch"}
    for name in sizes:
        assert after[name]["device"] == before[name]["device"] and \
            after[name]["state"] == "ready"
    kinds = [e["kind"] for e in cli_json(cuda_daemon, "events")]
    assert kinds.count("adopt") == 3
    assert cli_json(cuda_daemon, "check")["clean"]


# ---- attach -------------------------------------------------------------------------------------
PRODUCER = """
    import ctypes, time, numpy as np, gpumemctl
    a = gpumemctl.attach(ARGS[0], "rw", SOCK)
    n = a.size // 4
    i = np.arange(n, dtype=np.uint64)
    words = (((i * 2 + 1337) ^ 0xDEADBEEF) & 0xFFFFFFFF).astype(np.uint32)
    # On the fake driver a device pointer is a host address.
    np.ctypeslib.as_array((ctypes.c_uint32 * n).from_address(a.ptr))[:] = words
    print("READY", flush=True)
    time.sleep(600)
"""

CONSUMER = """
    import ctypes, numpy as np, gpumemctl
    with gpumemctl.attach(ARGS[0], "r", SOCK) as a:
        n = a.size // 4
        i = np.arange(n, dtype=np.uint64)
        words = (((i * 2 + 1337) ^ 0xDEADBEEF) & 0xFFFFFFFF).astype(np.uint32)
        got = np.ctypeslib.as_array((ctypes.c_uint32 * n).from_address(a.ptr))
        print(int(np.count_nonzero(got != words)), n, a.__dlpack_device__())
"""


def test_producer_killed_after_writing_through_attach_consumer_sees_every_word(cuda_daemon):
    cli(cuda_daemon, "create", "pc", "--size", str(6 * MiB + 8), "--device", "1", check=True)
    prelude = f"import sys\nSOCK = {cuda_daemon.socket!r}\nARGS = sys.argv[1:]\n"
    producer = subprocess.Popen([PYTHON, "-c", prelude + textwrap.dedent(PRODUCER), "pc"],
                                stdout=subprocess.PIPE, text=True,
                                env=child_env(cuda_daemon.extra_env), cwd=ROOT)
    try:
        assert producer.stdout.readline().strip() == "READY"
        holders = cli_json(cuda_daemon, "info", "pc")["holders"]
        assert [h["kind"] for h in holders] == ["attach-w"]
        assert b"locked: attach-w" in cli(cuda_daemon, "read", "pc", check=9).stderr
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.wait(10)
    wait_for(lambda: not cli_json(cuda_daemon, "info", "pc")["holders"],
             what="the killed writer's lock to go")
    info = cli_json(cuda_daemon, "info", "pc")
    assert info["unsealed"] is True               # the writer never detached or sealed
    mismatches, words, device = ok(run_py(cuda_daemon, CONSUMER, "pc")).strip().split(maxsplit=2)
    assert (int(mismatches), int(words), device) == (0, (6 * MiB + 8) // 4, "(2, 1)")
    assert "unsealed" in [e["kind"] for e in cli_json(cuda_daemon, "events")]


def test_attach_locks_follow_one_writer_or_many_readers(cuda_daemon):
    cli(cuda_daemon, "create", "l", "--size", "1M", check=True)
    code = """
        import subprocess, gpumemctl
        mode, *cmd = ARGS
        with gpumemctl.attach("l", mode, SOCK):
            print(subprocess.run(cmd, capture_output=True).returncode)
    """
    ctl = script_argv("gpumemctl") + ["--socket", cuda_daemon.socket]
    assert ok(run_py(cuda_daemon, code, "rw", *ctl, "read", "l")).strip() == "9"
    assert ok(run_py(cuda_daemon, code, "rw", *ctl, "write", "l", "/dev/null")).strip() == "9"
    assert ok(run_py(cuda_daemon, code, "r", *ctl, "write", "l", "/dev/null")).strip() == "9"
    assert ok(run_py(cuda_daemon, code, "r", *ctl, "info", "l")).strip() == "0"
    assert ok(run_py(cuda_daemon, code, "r", *ctl, "read", "l", "/dev/null")).strip() == "0"


def test_dlpack_exports_keep_the_attachment_until_released(cuda_daemon):
    cli(cuda_daemon, "create", "d", "--size", "3M", "--device", "1", check=True)
    code = """
        import gpumemctl
        c = gpumemctl.Client(SOCK)
        a = gpumemctl.attach("d", "rw", SOCK)
        cap = a.__dlpack__(stream=None, max_version=(1, 0))
        print(a.__dlpack_device__(), repr(cap).split('"')[1])
        print(a.__cuda_array_interface__["data"][1], a.__cuda_array_interface__["shape"])
        print(hasattr(a, "__array_interface__"))
        a.detach()                       # deferred (a capsule is alive), but sealed now
        print([h["kind"] for h in c.info("d")["holders"]], c.info("d")["unsealed"])
        del cap                          # released: the detach completes
        print([h["kind"] for h in c.info("d")["holders"]], c.info("d")["unsealed"], a.detached)
    """
    assert ok(run_py(cuda_daemon, code)).splitlines() == [
        "(2, 1) dltensor", "False (3145728,)", "False", "['attach-w'] False", "[] False True"]


def test_read_only_attach_cannot_change_the_data(cuda_daemon):
    cli(cuda_daemon, "create", "ro", "--size", "4096", check=True)
    cli(cuda_daemon, "write", "ro", input=b"original", check=True)
    api = """
        import gpumemctl
        from gpumemctl.protocol import UsageError
        with gpumemctl.attach("ro", "r", SOCK) as a:
            try:
                a.write(b"changed")
            except UsageError as exc:
                print(exc)
    """
    assert "attached read-only" in ok(run_py(cuda_daemon, api))
    # A store through the pointer: on the fake driver the read-only mapping is PROT_READ, so
    # the process dies with SIGSEGV (a GPU kernel faults instead: tests/gpu).
    store = """
        import ctypes, gpumemctl
        a = gpumemctl.attach("ro", "r", SOCK)
        ctypes.memmove(a.ptr, b"CHANGED", 7)
        print("store succeeded")
    """
    proc = run_py(cuda_daemon, store)
    assert proc.returncode == -signal.SIGSEGV and "store succeeded" not in proc.stdout
    assert cli(cuda_daemon, "read", "ro", "--length", "8", check=True).stdout == b"original"
    wait_for(lambda: not cli_json(cuda_daemon, "info", "ro")["holders"],
             what="the dead reader's holder to go")


def test_leased_transient_memory_is_returned_when_its_client_dies(cuda_daemon):
    free = lambda: cli_json(cuda_daemon, "devices")[0]["free"]   # noqa: E731
    before = free()
    code = """
        import time, gpumemctl
        c = gpumemctl.Client(SOCK)
        c.create("lease/x", 64 << 20, lease=True, device=0)
        print("READY", flush=True)
        time.sleep(600)
    """
    prelude = f"import sys\nSOCK = {cuda_daemon.socket!r}\n"
    child = subprocess.Popen([PYTHON, "-c", prelude + textwrap.dedent(code)],
                             stdout=subprocess.PIPE, text=True,
                             env=child_env(cuda_daemon.extra_env), cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "READY"
        assert free() == before - with_parity(64 * MiB)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    wait_for(lambda: free() == before, what="the leased memory to be freed")
    assert cli_json(cuda_daemon, "ls", "lease") == []


# ---- dma-buf ------------------------------------------------------------------------------------
def test_export_dmabuf_passes_an_fd(cuda_daemon):
    cli(cuda_daemon, "create", "rdma", "--size", "3M", check=True)
    with cuda_daemon.client() as c:
        fd = c.export_dmabuf("rdma")
        try:
            os.fstat(fd)
            assert "dmabuf" in os.readlink(f"/proc/self/fd/{fd}")   # the fake's memfd name
        finally:
            os.close(fd)


def test_export_dmabuf_where_unsupported_is_invalid_state(fake_lib, daemon_factory):
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib, FAKECUDA_NO_DMABUF="1"))
    d.cli("create", "rdma", "--size", "1M", env=d.extra_env, check=True)
    from gpumemctl.protocol import InvalidState
    with d.client() as c, pytest.raises(InvalidState, match="does not support dma-buf"):
        c.export_dmabuf("rdma")


def test_mount_on_the_cuda_backend(fake_lib, daemon_factory):
    """The mount's data path on the cuda backend (pinned staging views, device memset and
    device-to-device copies for resizes), on the fake driver: the POSIX helpers pass."""
    from tests.mount import posix
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib), mount=True)
    for check in posix.ALL:
        check(d.mnt)
        assert os.listdir(d.mnt) == []
    cli(d, "check", check=True)


def test_snapshot_round_trip_on_the_cuda_backend_through_the_staging_buffers(cuda_daemon,
                                                                             tmp_path):
    """`snapshot create` reads GPU memory through the client's pinned staging path (several
    64 MiB chunks and a ragged tail), `restore` refills the allocation after it was lost,
    and an incremental snapshot after a small write writes only that block."""
    size = 150 * MiB + 777
    data = os.urandom(size)
    (tmp_path / "in.bin").write_bytes(data)
    cli(cuda_daemon, "create", "w", "--size", str(size), "--durable", check=True)
    cli(cuda_daemon, "write", "w", str(tmp_path / "in.bin"), check=True)
    store = tmp_path / "snaps"
    made = cli_json(cuda_daemon, "snapshot", "create", str(store))
    assert made["io"] == "posix" and made["bytes_written"] == size
    cuda_daemon.stop()
    cuda_daemon.kill_keeper()
    cuda_daemon.start()
    assert cli_json(cuda_daemon, "info", "w")["state"] == "lost"
    back = cli_json(cuda_daemon, "snapshot", "restore", str(store))
    assert back["allocations"][0]["result"] == "ok"
    out = cli(cuda_daemon, "read", "w", timeout=120, check=True).stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
    # After a restart the daemon cannot know what changed: all is read, nothing differs.
    again = cli_json(cuda_daemon, "snapshot", "create", str(store), "--incremental")
    assert again["bytes_read"] == size and again["bytes_written"] == 0
    cli(cuda_daemon, "write", "w", "--offset", str(100 * MiB + 5), input=b"new", check=True)
    inc = cli_json(cuda_daemon, "snapshot", "create", str(store), "--incremental")
    assert inc["incremental"] and inc["bytes_written"] == MiB and inc["bytes_read"] == MiB
    cli(cuda_daemon, "snapshot", "restore", str(store), "--as", "copy", "--device", "1",
        check=True)                                  # onto the other GPU
    assert cli_json(cuda_daemon, "info", "copy/w")["device"] == FAKE_UUID1
    out = cli(cuda_daemon, "read", "copy/w", timeout=120, check=True).stdout
    want = data[:100 * MiB + 5] + b"new" + data[100 * MiB + 8:]
    assert hashlib.sha256(out).digest() == hashlib.sha256(want).digest()


def test_a_large_file_goes_through_the_pipelined_staging_buffers(cuda_daemon, tmp_path):
    """gpumemctl load and write of a file of 256 MiB or more (gpumemctl/memory.py
    _write_pipelined: several buffers' reads in flight), at offset 0 and past it."""
    import numpy as np
    from safetensors.numpy import save_file
    data = os.urandom(300 * MiB + 4097)
    model = str(tmp_path / "m.safetensors")
    save_file({"w": np.frombuffer(data, np.uint8), "b": np.arange(5, dtype=np.int64)}, model)
    out = cli_json(cuda_daemon, "load", model, "m")
    assert out["bytes"] == len(data) + 40 and out["copy_seconds"] > 0
    cli(cuda_daemon, "save", "m", str(tmp_path / "back.safetensors"), check=True, timeout=120)
    assert hashlib.sha256((tmp_path / "back.safetensors").read_bytes()).digest() == \
        hashlib.sha256(open(model, "rb").read()).digest()
    (tmp_path / "raw.bin").write_bytes(data)
    cli(cuda_daemon, "create", "w", "--size", str(len(data) + MiB), check=True)
    cli(cuda_daemon, "write", "w", str(tmp_path / "raw.bin"), "--offset", "1M", check=True,
        timeout=120)
    got = cli(cuda_daemon, "read", "w", "--offset", "1M", timeout=120, check=True).stdout
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
