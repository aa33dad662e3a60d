"""The cuda backend, attach() and dma-buf on a real GPU (run on the GPU machine: pytest -m gpu).

Each test starts its own `gpumemd --backend cuda`. Code that uses CUDA, PyTorch or CuPy runs in
child processes (a GPU fault kills the child, never pytest), with GPU_LIB below prepended:
patterns are written and verified on the GPU, never by copying gigabytes to the host.
Observations that the docs quote (what a write to a read-only attachment does) are printed and
appended as JSON lines to $GPUMEM_GPU_REPORT (default /tmp/gpumem-gpu-report.jsonl).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import textwrap

import pytest

from tests.harness import PYTHON, ROOT, child_env, usable_gpus, wait_for

pytestmark = pytest.mark.gpu

MiB, GiB = 1 << 20, 1 << 30
REPORT = os.environ.get("GPUMEM_GPU_REPORT", "/tmp/gpumem-gpu-report.jsonl")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture
def gpu_arrays():
    """Tests that make and check patterns on the GPU need CuPy or PyTorch. (A fixture, not a
    skipif mark, so that without a GPU every test here skips with the one reason.)"""
    if not (HAVE_TORCH or HAVE_CUPY):
        pytest.skip("needs torch or cupy for GPU-side patterns")


@pytest.fixture
def torch_and_cupy():
    if not (HAVE_TORCH and HAVE_CUPY):
        pytest.skip("needs both torch and cupy")

GPU_LIB = r'''
import contextlib, json, sys, time
import gpumemctl

def array_lib():
    """CuPy where installed, else PyTorch."""
    try:
        import cupy
        return "cupy", cupy
    except ImportError:
        import torch
        return "torch", torch

def on(device):
    name, xp = array_lib()
    return xp.cuda.Device(device) if name == "cupy" else xp.cuda.device(device)

def as_words(a):
    """The attachment's first size//4*4 bytes as 32-bit words, in place."""
    name, xp = array_lib()
    n = a.size // 4
    arr = xp.from_dlpack(a)[: n * 4]
    return arr.view(xp.uint32) if name == "cupy" else arr.view(xp.int32)

def expected(words, start, count, seed):
    """Words [start, start+count) of (i*2 + 1337 + seed) ^ 0xDEADBEEF mod 2**32, made on the
    GPU (as int32 bit patterns under torch, which lacks uint32 arithmetic)."""
    name, xp = array_lib()
    if name == "cupy":
        i = xp.arange(start, start + count, dtype=xp.uint64)
        return (((i * 2 + 1337 + seed) ^ 0xDEADBEEF) & 0xFFFFFFFF).astype(xp.uint32)
    i = xp.arange(start, start + count, dtype=xp.int64, device=words.device)
    v = ((i * 2 + 1337 + seed) ^ 0xDEADBEEF) & 0xFFFFFFFF
    return xp.where(v >= 2 ** 31, v - 2 ** 32, v).to(xp.int32)

STEP = 1 << 26      # words per step: temporaries stay well under a GiB

def sync():
    name, xp = array_lib()
    if name == "cupy":
        xp.cuda.Device().synchronize()
    else:
        xp.cuda.synchronize()

def fill(words, seed):
    for s in range(0, words.shape[0], STEP):
        n = min(STEP, words.shape[0] - s)
        words[s:s + n] = expected(words, s, n, seed)
    sync()

def mismatches(words, seed):
    bad = 0
    for s in range(0, words.shape[0], STEP):
        n = min(STEP, words.shape[0] - s)
        bad += int((words[s:s + n] != expected(words, s, n, seed)).sum())
    return bad
'''


def script(daemon, body: str) -> str:
    return f"SOCK = {daemon.socket!r}\n" + GPU_LIB + "\nimport sys\nARGS = sys.argv[1:]\n" + \
        textwrap.dedent(body)


def run_gpu(daemon, body: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", script(daemon, body), *args], capture_output=True,
                          text=True, env=child_env(), cwd=ROOT, timeout=timeout)


def spawn_gpu(daemon, body: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-c", script(daemon, body), *args], stdout=subprocess.PIPE,
                            text=True, env=child_env(), cwd=ROOT)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(what: str, **facts) -> None:
    line = json.dumps({"observation": what, **facts})
    print(line)
    with open(REPORT, "a") as f:
        f.write(line + "\n")


def device_facts(index: int = 0) -> dict:
    code = (f"import json; from gpumemctl import cudadrv as c; s = c.device_support({index}); "
            f"print(json.dumps({{'dma_buf': s.dma_buf, 'uuid': c.device_uuid({index})}}))")
    return json.loads(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                                     env=child_env(), check=True).stdout)


@pytest.fixture
def gpu_daemon(daemon_factory):
    return daemon_factory(backend="cuda")


def free_bytes(daemon, index: int = 0) -> int:
    """cuMemGetInfo's free bytes, as the daemon sees them (every process on the GPU)."""
    return daemon.cli_json("devices")[index]["free"]


# ---- attach ---------------------------------------------------------------------------------
PRODUCER = """
    a = gpumemctl.attach(ARGS[0], "rw", SOCK)
    with on(a.device):
        fill(as_words(a), 0)
    print("READY", flush=True)
    time.sleep(600)
"""

VERIFY = """
    result = {}
    for name, seed in zip(ARGS[0::2], ARGS[1::2]):
        with gpumemctl.attach(name, "r", SOCK) as a:
            with on(a.device):
                words = as_words(a)
                result[name] = {"bad": mismatches(words, int(seed)),
                                "words": int(words.shape[0]), "device": a.device_uuid}
                del words
    print(json.dumps(result))
"""


def test_producer_sigkilled_after_writing_consumer_verifies_every_word(gpu_daemon, gpu_arrays):
    size = GiB + 12
    gpu_daemon.cli("create", "pc/data", "--size", str(size), check=True)
    producer = spawn_gpu(gpu_daemon, PRODUCER, "pc/data")
    try:
        assert producer.stdout.readline().strip() == "READY"
        assert [h["kind"] for h in gpu_daemon.cli_json("info", "pc/data")["holders"]] == \
            ["attach-w"]
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.wait(30)
    wait_for(lambda: gpu_daemon.cli_json("info", "pc/data")["holders"] == [], timeout=30,
             what="the killed writer's lock to go")
    assert gpu_daemon.cli_json("info", "pc/data")["unsealed"] is True
    result = last_json(run_gpu(gpu_daemon, VERIFY, "pc/data", "0"))["pc/data"]
    assert result["words"] == size // 4 and result["bad"] == 0


def test_kill9_of_gpumemd_readopts_three_durable_allocations_one_16g(gpu_daemon, gpu_arrays):
    sizes = {"dur/big": 16 * GiB, "dur/mid": GiB + 4100, "dur/small": 3 * MiB + 8}
    if free_bytes(gpu_daemon) < sum(sizes.values()) + 4 * GiB:
        pytest.skip("device 0 has less than 21 GiB free")
    seeds = {name: str(i + 1) for i, name in enumerate(sizes)}
    for name, size in sizes.items():
        gpu_daemon.cli("create", name, "--size", str(size), "--durable", check=True)
    fill_all = """
        for name, seed in zip(ARGS[0::2], ARGS[1::2]):
            with gpumemctl.attach(name, "rw", SOCK) as a:
                with on(a.device):
                    words = as_words(a)
                    fill(words, int(seed))
                    del words
        print(json.dumps({"ok": True}))
    """
    pairs = [x for name in sizes for x in (name, seeds[name])]
    last_json(run_gpu(gpu_daemon, fill_all, *pairs))
    before = {e["path"]: e for e in gpu_daemon.cli_json("ls", "-R")}
    gpu_daemon.kill9()
    gpu_daemon.start()
    after = {e["path"]: e for e in gpu_daemon.cli_json("ls", "-R")}
    for name in sizes:
        for field in ("id", "size", "capacity", "device", "durable"):
            assert after[name][field] == before[name][field], (name, field)
        assert after[name]["state"] == "ready"
    assert [e["kind"] for e in gpu_daemon.cli_json("events")].count("adopt") == 3
    result = last_json(run_gpu(gpu_daemon, VERIFY, *pairs))
    for name, size in sizes.items():
        assert result[name] == {"bad": 0, "words": size // 4,
                                "device": before[name]["device"]}, name
    assert gpu_daemon.cli_json("check")["clean"]


def test_leased_transient_memory_is_returned_when_its_client_dies(gpu_daemon):
    before = free_bytes(gpu_daemon)
    code = """
        import time, gpumemctl
        c = gpumemctl.Client(SOCK)
        c.create("lease/x", 2 << 30, lease=True)
        print("READY", flush=True)
        time.sleep(600)
    """
    child = subprocess.Popen([PYTHON, "-c", f"SOCK = {gpu_daemon.socket!r}\n" +
                              textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                             env=child_env(), cwd=ROOT)
    try:
        assert child.stdout.readline().strip() == "READY"
        during = free_bytes(gpu_daemon)
        assert before - during >= 2 * GiB - 64 * MiB, (before, during)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    wait_for(lambda: abs(free_bytes(gpu_daemon) - before) <= 64 * MiB, timeout=30,
             what="cuMemGetInfo to show the leased 2 GiB free again")
    assert gpu_daemon.cli_json("ls", "lease") == []
    report("leased transient returned", free_before=before, free_during=during,
           free_after=free_bytes(gpu_daemon))


def test_torch_and_cupy_see_the_bytes_written_by_gpumemctl_write(gpu_daemon, tmp_path,
                                                                torch_and_cupy):
    data = os.urandom(3 * MiB + 5)
    (tmp_path / "in").write_bytes(data)
    gpu_daemon.cli("create", "dl/x", "--size", str(len(data)), check=True)
    gpu_daemon.cli("write", "dl/x", str(tmp_path / "in"), check=True)
    code = """
        import hashlib, gc, torch, cupy
        out = {}
        a = gpumemctl.attach("dl/x", "r", SOCK)
        t = torch.from_dlpack(a)
        out["torch_device"] = str(t.device)
        out["torch"] = hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()
        with cupy.cuda.Device(a.device):
            out["cupy_dlpack"] = hashlib.sha256(cupy.from_dlpack(a).get().tobytes()).hexdigest()
            out["cupy_cai"] = hashlib.sha256(cupy.asarray(a).get().tobytes()).hexdigest()
        a.detach()
        out["deferred"] = not a.detached           # the torch tensor is still alive
        del t
        gc.collect()
        out["detached"] = a.detached
        out["device"] = a.device
        print(json.dumps(out))
    """
    out = last_json(run_gpu(gpu_daemon, code))
    want = hashlib.sha256(data).hexdigest()
    assert out["torch"] == out["cupy_dlpack"] == out["cupy_cai"] == want
    assert out["torch_device"] == f"cuda:{out['device']}"
    assert out["deferred"] and out["detached"]
    assert gpu_daemon.cli_json("info", "dl/x")["holders"] == []


def test_read_only_attach_cannot_change_the_data(gpu_daemon, gpu_arrays):
    original = b"original" * 512
    gpu_daemon.cli("create", "ro", "--size", str(len(original)), check=True)
    gpu_daemon.cli("write", "ro", input=original, check=True)
    attempts = {
        "kernel store": """
            a = gpumemctl.attach("ro", "r", SOCK)
            name, xp = array_lib()
            with on(a.device):
                arr = xp.from_dlpack(a)
                try:
                    arr[:] = 0
                    sync()
                    print(json.dumps({"raised": None}))
                except Exception as exc:
                    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)[:300]}))
        """,
        "cuMemcpyHtoD": """
            from gpumemctl import cudadrv
            a = gpumemctl.attach("ro", "r", SOCK)
            try:
                with cudadrv.context(a.device):
                    cudadrv.memcpy_htod(a.ptr, b"CHANGED!" * 8, 64)
                    cudadrv.ctx_synchronize()
                print(json.dumps({"raised": None}))
            except Exception as exc:
                print(json.dumps({"raised": type(exc).__name__, "message": str(exc)[:300]}))
        """,
        "Attachment.write": """
            a = gpumemctl.attach("ro", "r", SOCK)
            try:
                a.write(b"CHANGED!")
                print(json.dumps({"raised": None}))
            except Exception as exc:
                print(json.dumps({"raised": type(exc).__name__, "message": str(exc)[:300]}))
        """,
    }
    for what, body in attempts.items():
        proc = run_gpu(gpu_daemon, body)
        lines = proc.stdout.strip().splitlines()
        outcome = json.loads(lines[-1]) if lines else {}
        report(f"write to a read-only attachment: {what}", returncode=proc.returncode,
               outcome=outcome, stderr_tail=proc.stderr[-600:])
        assert proc.returncode != 0 or outcome.get("raised"), \
            f"{what} into a read-only attachment reported success"
        assert gpu_daemon.cli("read", "ro", check=True).stdout == original, what
        wait_for(lambda: gpu_daemon.cli_json("info", "ro")["holders"] == [], timeout=30,
                 what="the reader's holder to go")
    gpu_daemon.cli("create", "after", "--size", "1M", check=True)    # still serving


def test_over_large_request_fails_cleanly_and_the_daemon_keeps_serving(gpu_daemon):
    dev = gpu_daemon.cli_json("devices")[0]
    request = dev["total"] + GiB
    proc = gpu_daemon.cli("create", "huge", "--size", str(request), "--device", dev["uuid"],
                          check=7)
    err = proc.stderr.decode().strip()
    assert len(err.splitlines()) == 1, err
    assert f"out of memory on device 0 ({dev['uuid']})" in err
    assert "free" in err and f"{request} bytes) requested" in err
    gpu_daemon.cli("create", "small", "--size", "1M", check=True)
    assert [e["path"] for e in gpu_daemon.cli_json("ls")] == ["small"]
    report("over-large create", message=err)


def test_export_dmabuf_returns_a_dmabuf_fd(gpu_daemon):
    gpu_daemon.cli("create", "rdma", "--size", "64M", check=True)
    supported = device_facts(0)["dma_buf"]
    from gpumemctl.protocol import InvalidState
    with gpu_daemon.client() as c:
        if not supported:
            with pytest.raises(InvalidState, match="does not support dma-buf"):
                c.export_dmabuf("rdma")
            pytest.skip("device 0 has no dma-buf support; the clear error was checked")
        fd = c.export_dmabuf("rdma")
        try:
            st = os.fstat(fd)
            link = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                fdinfo = f.read()
        finally:
            os.close(fd)
    report("dma-buf fd", readlink=link, st_size=st.st_size, fdinfo=fdinfo[:400])
    assert "dmabuf" in link or "exp_name" in fdinfo


def test_cli_write_and_read_round_trip_on_the_gpu(gpu_daemon, tmp_path):
    size = 256 * MiB + 12345          # several 64 MiB staging chunks and a ragged tail
    data = os.urandom(size)
    (tmp_path / "in").write_bytes(data)
    gpu_daemon.cli("create", "io", "--size", str(size), check=True)
    gpu_daemon.cli("write", "io", str(tmp_path / "in"), check=True)
    out = gpu_daemon.cli("read", "io", check=True, timeout=120).stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
    part = gpu_daemon.cli("read", "io", "--offset", str(100 * MiB - 7), "--length", "1000",
                          check=True).stdout
    assert part == data[100 * MiB - 7:100 * MiB + 993]


def test_two_gpus_one_allocation_each_attached_from_separate_processes(gpu_daemon, gpu_arrays):
    if usable_gpus() < 2:
        pytest.skip("needs two GPUs")
    devs = gpu_daemon.cli_json("devices")
    gpu_daemon.cli("create", "g/0", "--size", "256M", "--device", "0", check=True)
    gpu_daemon.cli("create", "g/1", "--size", "256M", "--device", devs[1]["uuid"], check=True)
    writer = """
        a = gpumemctl.attach(ARGS[0], "rw", SOCK)
        with on(a.device):
            fill(as_words(a), int(ARGS[1]))
        print(json.dumps({"uuid": a.device_uuid, "device": a.device,
                          "dlpack": list(a.__dlpack_device__())}))
        a.detach()
    """
    procs = [subprocess.Popen([PYTHON, "-c", script(gpu_daemon, writer), f"g/{i}", str(10 + i)],
                              stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
             for i in (0, 1)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        outs.append(json.loads(out.strip().splitlines()[-1]))
    for i, out in enumerate(outs):
        assert out["uuid"] == devs[i]["uuid"] and out["dlpack"] == [2, out["device"]]
    result = last_json(run_gpu(gpu_daemon, VERIFY, "g/0", "10", "g/1", "11"))
    assert result["g/0"]["bad"] == 0 and result["g/1"]["bad"] == 0
    assert result["g/0"]["device"] != result["g/1"]["device"]
