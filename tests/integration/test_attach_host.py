"""gpumemctl.attach() on the host backend: the same API and lock rules as on a GPU, with mmap.

numpy stands in for PyTorch/CuPy: it takes the attachment through DLPack (numpy.from_dlpack)
and through __array_interface__.
"""
from __future__ import annotations

import gc
import signal
import subprocess
import textwrap

import numpy as np
import pytest

import gpumemctl
from gpumemctl.protocol import Busy, InvalidState, NotFound, UsageError
from tests.harness import PYTHON, ROOT, child_env, wait_for

MiB = 1 << 20


def pattern_words(n: int) -> np.ndarray:
    """The issue's pattern: word i is (i*2 + 1337) ^ 0xDEADBEEF, as uint32."""
    i = np.arange(n, dtype=np.uint64)
    return (((i * 2 + 1337) ^ 0xDEADBEEF) & 0xFFFFFFFF).astype(np.uint32)


def child(daemon, code: str, *args: str, **popen) -> subprocess.Popen:
    prelude = f"import sys\nSOCK = {daemon.socket!r}\nARGS = sys.argv[1:]\n"
    return subprocess.Popen([PYTHON, "-c", prelude + textwrap.dedent(code), *args],
                            env=child_env(), cwd=ROOT, text=True, **popen)


@pytest.mark.slabs_off
def test_numpy_sees_the_bytes_written_by_gpumemctl_write(daemon):
    data = bytes(range(256)) * 40 + b"tail"
    daemon.cli("create", "w/x", "--size", str(len(data)), check=True)
    daemon.cli("write", "w/x", input=data, check=True)
    with gpumemctl.attach("w/x", "r", daemon.socket) as a:
        assert (a.size, a.capacity, a.device, a.backend) == (len(data), 2 * MiB, 0, "host")
        assert a.__dlpack_device__() == (1, 0)
        assert not hasattr(a, "__cuda_array_interface__")
        arr = np.from_dlpack(a)
        assert arr.dtype == np.uint8 and arr.shape == (len(data),)
        assert arr.tobytes() == data
        assert np.asarray(a).tobytes() == data          # __array_interface__
        assert a.read(256, 4) == bytes([0, 1, 2, 3])
        del arr
    assert a.detached


def test_rw_attach_excludes_other_writers_and_readers(daemon):
    daemon.cli("create", "l", "--size", "1M", check=True)
    with daemon.client() as c, gpumemctl.attach("l", "rw", daemon.socket):
        assert [h["kind"] for h in c.info("l")["holders"]] == ["attach-w"]
        assert c.info("l")["unsealed"] is True
        for args in (("write", "l", "/dev/null"), ("read", "l")):
            err = daemon.cli(*args, check=9).stderr.decode()
            assert "locked: attach-w by pid" in err
        with pytest.raises(Busy):
            gpumemctl.attach("l", "rw", daemon.socket)
        with pytest.raises(Busy):
            gpumemctl.attach("l", "r", daemon.socket)
        assert "busy" in daemon.cli("rm", "l", check=9).stderr.decode()
    with daemon.client() as c:
        assert c.info("l")["holders"] == [] and c.info("l")["unsealed"] is False
        with gpumemctl.attach("l", "r", daemon.socket), \
                gpumemctl.attach("l", "r", daemon.socket):       # many readers
            assert [h["kind"] for h in c.info("l")["holders"]] == ["attach-r", "attach-r"]
            daemon.cli("read", "l", "/dev/null", check=True)
            assert "locked: attach-r" in daemon.cli("write", "l", "/dev/null",
                                                    check=9).stderr.decode()


PRODUCER = """
    import time, numpy as np, gpumemctl
    a = gpumemctl.attach(ARGS[0], "rw", SOCK)
    words = np.from_dlpack(a)[: a.size // 4 * 4].view(np.uint32)
    i = np.arange(words.size, dtype=np.uint64)
    words[:] = (((i * 2 + 1337) ^ 0xDEADBEEF) & 0xFFFFFFFF).astype(np.uint32)
    print("READY", flush=True)
    time.sleep(600)
"""


def test_producer_sigkilled_after_writing_consumer_verifies_every_word(daemon):
    size = 5 * MiB + 12
    daemon.cli("create", "pc/data", "--size", str(size), check=True)
    producer = child(daemon, PRODUCER, "pc/data", stdout=subprocess.PIPE)
    try:
        assert producer.stdout.readline().strip() == "READY"
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.wait(10)
    with daemon.client() as c:
        wait_for(lambda: c.info("pc/data")["holders"] == [], what="the writer's lock to go")
        assert c.info("pc/data")["unsealed"] is True     # it never detached or sealed
    with gpumemctl.attach("pc/data", "r", daemon.socket) as a:
        words = np.from_dlpack(a)[: size // 4 * 4].view(np.uint32)
        expected = pattern_words(size // 4)
        assert words.size == size // 4
        assert np.count_nonzero(words != expected) == 0
        del words
    with gpumemctl.attach("pc/data", "rw", daemon.socket) as w:   # the lock is free again
        w.seal()
    with daemon.client() as c:
        assert c.info("pc/data")["unsealed"] is False
    kinds = [e["kind"] for e in daemon.cli_json("events")]
    assert "unsealed" in kinds and "seal" in kinds


def test_read_only_attach_cannot_write(daemon):
    daemon.cli("create", "ro", "--size", "4096", check=True)
    daemon.cli("write", "ro", input=b"original", check=True)
    with gpumemctl.attach("ro", "r", daemon.socket) as a:
        arr = np.from_dlpack(a)        # DLPack 1.0 capsule with the read-only flag
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1
        with pytest.raises(ValueError):
            arr.flags.writeable = True
        view = np.asarray(a)           # __array_interface__ says read-only too
        assert not view.flags.writeable
        with pytest.raises(UsageError, match="attached read-only"):
            a.write(b"x")
        del arr, view
    # Forcing a store through the raw pointer: the mapping is PROT_READ, so the process dies
    # of SIGSEGV and the memory is unchanged (docs/cuda.md, "Read-only").
    proc = child(daemon, """
        import ctypes, gpumemctl
        a = gpumemctl.attach("ro", "r", SOCK)
        ctypes.memmove(a.ptr, b"CHANGED", 7)
        print("store succeeded", flush=True)
    """, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGSEGV and "store succeeded" not in out
    assert daemon.cli("read", "ro", "--length", "8", check=True).stdout == b"original"
    with daemon.client() as c:
        wait_for(lambda: c.info("ro")["holders"] == [], what="the dead reader's holder to go")


def test_detach_waits_for_dlpack_consumers(daemon):
    daemon.cli("create", "lt", "--size", "8192", check=True)
    with daemon.client() as c:
        a = gpumemctl.attach("lt", "rw", daemon.socket)
        arr = np.from_dlpack(a)
        arr[:5] = np.frombuffer(b"hello", dtype=np.uint8)
        a.detach()                                  # an array still uses the memory
        assert not a.detached and [h["kind"] for h in c.info("lt")["holders"]] == ["attach-w"]
        assert c.info("lt")["unsealed"] is False    # ... but the writer said it is done
        with pytest.raises(UsageError, match="detached"):
            a.__dlpack__()
        assert arr[:5].tobytes() == b"hello"
        del arr
        gc.collect()
        assert a.detached and c.info("lt")["holders"] == []
        assert c.read("lt", 0, 5) == b"hello"


def test_attach_errors_are_clear(daemon):
    with pytest.raises(NotFound):
        gpumemctl.attach("missing", "r", daemon.socket)
    daemon.cli("create", "e", "--size", "1", check=True)
    with pytest.raises(UsageError, match="invalid attach mode"):
        gpumemctl.attach("e", "w", daemon.socket)
    with daemon.client() as c:
        assert c.info("e")["holders"] == []
        a = c.attach("e", "r")                      # on an existing connection
        assert [h["session"] for h in c.info("e")["holders"]] == [c.hello["session"]]
        a.detach()
        assert c.info("e")["holders"] == []


def test_export_dmabuf_on_the_host_backend_is_a_clear_error(daemon):
    daemon.cli("create", "rdma", "--size", "1M", check=True)
    with daemon.client() as c:
        with pytest.raises(InvalidState, match="dma-buf export needs the cuda backend") as exc:
            c.export_dmabuf("rdma")
        assert exc.value.code == 10
        c.info("rdma")                              # the connection is still fine
