"""Sleep and wake at the same address on a real GPU (run on the GPU machine: pytest -m gpu;
issue 28, part 1; docs/engines.md, "Sleep and wake").

- The issue's test: tensors of a safetensors file, `gpumemctl load`ed, taken by
  `gpumemctl.tensors.load` in this process and read by a captured CUDA graph; `Client.sleep`
  parks the attachment and gives the device memory back (the device's free memory rises by
  about the allocation's size), `Client.wake` maps new memory at the same address: every
  tensor's data_ptr() is unchanged and the graph, replayed, gives the same output.
- A durable allocation asleep survives a kill -9 of gpumemd: its bytes are in the host tier
  the keeper holds; after the restart it is still asleep (read by copy from the host tier,
  a write refused with exit 10), and it wakes with its bytes, every block checked (a
  transient one asleep is gone, as any transient at a restart).
- Another process's attachment (not parked: only this process's are) makes `gpumemctl
  sleep` exit 9 (busy); once it is gone, the allocation sleeps and wakes.

Sizes stay modest: a 1 GiB file (and its copy on the device at the end), 64 MiB objects.
"""
from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest

from tests.harness import PYTHON, ROOT, child_env, is_keeper, store_random, usable_gpus, wait_for

pytestmark = pytest.mark.gpu

MiB, GiB = 1 << 20, 1 << 30
READ_COPY = 4 * MiB           # gpumemctl.protocol.defaults.READ_COPY_BYTES: one `read` answer
N, SIDE = 4, 8192             # four 8192x8192 float32 matrices: 256 MiB each, 1 GiB in all


@pytest.fixture
def gpu_daemon(daemon_factory):
    if usable_gpus() == 0:
        pytest.skip("needs a GPU")
    return daemon_factory(backend="cuda")


def holders(d, name: str) -> list[str]:
    with d.client() as c:
        return [h["kind"] for h in c.info(name)["holders"]]


def state(d, name: str) -> str:
    return d.cli_json("info", name)["state"]


def weights(torch) -> dict:
    g = torch.Generator().manual_seed(28)
    out = {f"w{i}": torch.randn(SIDE, SIDE, generator=g) for i in range(N)}
    out["x"] = torch.randn(SIDE, generator=g)
    out["scale"] = torch.randn(SIDE, generator=g).to(torch.bfloat16)
    return out


def compute(torch, t: dict):
    """What the graph computes: a chain of matrix-vector products over the four matrices,
    and each matrix's sum (every byte of the allocation's tensors is read)."""
    y = t["x"]
    ws = [t[f"w{i}"] for i in range(N)]
    for w in ws:
        y = torch.tanh(w @ y)
    return torch.cat([y * t["scale"].float(), torch.stack([w.sum() for w in ws])])


def free_bytes(torch, device) -> int:
    torch.cuda.synchronize(device)
    return torch.cuda.mem_get_info(device)[0]


# ---- the test --------------------------------------------------------------------------
@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_a_graph_over_sleeping_tensors_replays_identically_after_wake(gpu_daemon, tmp_path,
                                                                      durable):
    torch = pytest.importorskip("torch", reason="needs torch (pip install torch): not installed")
    st_torch = pytest.importorskip("safetensors.torch",
                                   reason="needs safetensors (pip install safetensors)")
    import gpumemctl.tensors
    d = gpu_daemon
    path = str(tmp_path / "m.safetensors")
    st_torch.save_file(weights(torch), path, metadata={"format": "pt"})
    d.cli("load", path, "m", *(["--durable"] if durable else []), "--json", check=True,
          timeout=300)
    size = d.cli_json("info", "m")["size"]
    assert size > N * SIDE * SIDE * 4, size

    got = gpumemctl.tensors.load("m", framework="torch", socket=d.socket)
    dev = got["w0"].device
    assert dev.type == "cuda", dev
    ptrs = {k: v.data_ptr() for k, v in got.items()}
    base = got.attachments[0].ptr
    with torch.cuda.device(dev):
        side = torch.cuda.Stream(dev)              # warm up off the capture stream (torch docs)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                compute(torch, got)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compute(torch, got)
        graph.replay()
        torch.cuda.synchronize(dev)
        before = out.clone()
        graph.replay()
        torch.cuda.synchronize(dev)
        assert torch.equal(out, before), "the graph is not deterministic: nothing to compare"

        free_awake = free_bytes(torch, dev)
        with d.client() as c:
            t0 = time.perf_counter()
            slept = c.sleep("m")
            sleep_s = time.perf_counter() - t0
        assert state(d, "m") == "asleep"
        # The device memory is given back: the daemon's and this process's mapping of it.
        need = int(0.9 * size)
        deadline = time.monotonic() + 30
        while (free_asleep := free_bytes(torch, dev)) - free_awake < need \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert free_asleep - free_awake >= need, (
            f"asleep, the device's free memory rose by {(free_asleep - free_awake) / MiB:.0f} "
            f"MiB; the allocation is {size / MiB:.0f} MiB")

        with d.client() as c:
            t0 = time.perf_counter()
            woke = c.wake("m")
            wake_s = time.perf_counter() - t0
        assert state(d, "m") == "ready"
        print(f"\n{size / GiB:.2f} GiB {'durable' if durable else 'transient'}: sleep "
              f"{sleep_s:.3f} s, wake {wake_s:.3f} s; the device's free memory rose by "
              f"{(free_asleep - free_awake) / GiB:.2f} GiB asleep\n"
              f"sleep: {str(slept)[:400]}\nwake: {str(woke)[:400]}")
        assert got.attachments[0].ptr == base
        assert {k: v.data_ptr() for k, v in got.items()} == ptrs     # the same addresses
        free_woken = free_bytes(torch, dev)
        assert free_asleep - free_woken >= need, "awake again, the memory is taken again"

        graph.replay()                     # the graph's pointers are valid: the same output
        torch.cuda.synchronize(dev)
        assert torch.equal(out, before)
        del graph, out

    want = st_torch.load_file(path, device=str(dev))    # and every byte is the file's
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    del want, got
    wait_for(lambda: holders(d, "m") == [], what="the attachment to go")


# ---- durable while asleep ----------------------------------------------------------------------
def test_a_durable_allocation_asleep_survives_a_kill9_and_wakes_with_its_bytes(gpu_daemon):
    d = gpu_daemon
    data = store_random(d, "keep", size=64 * MiB + 4099, durable=True)
    store_random(d, "gone", size=16 * MiB, durable=False)

    replies = json.loads(d.cli("sleep", "keep", "gone", "--json", check=True).stdout)
    assert [r["info"]["state"] for r in replies] == ["asleep", "asleep"], replies
    assert replies[0]["bytes"] >= len(data) and replies[0]["already"] is False, replies[0]
    assert state(d, "keep") == "asleep"
    again = json.loads(d.cli("sleep", "keep", "--json", check=True).stdout)
    assert again[0]["already"] is True, again          # asleep already: nothing done
    with d.client() as c:                              # a read by copy: the host tier
        assert c.read_copy("keep", 0, READ_COPY) == data[:READ_COPY]

    keeper = d.keeper_pid()
    with open(f"/proc/{d.proc.pid}/cmdline", "rb") as f:
        assert b"daemon.main" in f.read()              # gpumemd itself, not a wrapper
    d.kill9()                                          # SIGKILL to gpumemd's own process
    assert keeper is not None and is_keeper(keeper, d.state_dir), "the keeper went too"
    d.start()
    assert state(d, "keep") == "asleep"
    assert d.cli("info", "gone").returncode == 4       # a transient goes, asleep or not
    # Asleep, `gpumemctl read` is served by copy from the host tier; a write is refused.
    assert d.cli("read", "keep", check=True, timeout=120).stdout == data
    assert d.cli("write", "keep", input=b"x").returncode == 10

    woke = json.loads(d.cli("wake", "keep", "--json", check=True, timeout=120).stdout)
    assert woke[0]["info"]["state"] == "ready" and woke[0]["already"] is False, woke
    verify = woke[0]["verify"]
    assert verify["uncorrectable"] == 0 and verify["blocks"] > 0, verify
    assert state(d, "keep") == "ready"
    assert d.cli("read", "keep", check=True, timeout=120).stdout == data


# ---- refused: another process's attachment -----------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys
    import gpumemctl
    a = gpumemctl.attach(sys.argv[2], "r", sys.argv[1])
    print("attached", a.ptr, flush=True)
    sys.stdin.read()                   # until the test closes our stdin
    a.detach()
""")


def test_another_process_holding_an_attachment_makes_sleep_exit_9(gpu_daemon, tmp_path):
    d = gpu_daemon
    data = store_random(d, "held", size=16 * MiB, durable=False)   # memory of its own
    with open(tmp_path / "holder.err", "wb") as err:
        proc = subprocess.Popen([PYTHON, "-c", HOLDER, d.socket, "held"], env=child_env(),
                                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("attached"), (tmp_path / "holder.err").read_text()
        assert holders(d, "held") == ["attach-r"]
        refused = d.cli("sleep", "held")
        assert refused.returncode == 9, (refused.returncode, refused.stderr)
        print(f"\nrefused: {refused.stderr.decode().strip()}")
        assert state(d, "held") == "ready"
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert proc.returncode == 0, (tmp_path / "holder.err").read_text()
    wait_for(lambda: holders(d, "held") == [], what="the holder's attachment to go")

    d.cli("sleep", "held", check=True)                 # nobody holds it now
    assert state(d, "held") == "asleep"
    d.cli("wake", "held", check=True)
    assert d.cli("read", "held", check=True).stdout == data
