"""The mount on the cuda backend (GPU machine: pytest -m gpu tests/gpu/test_mount_cuda.py).

The POSIX helpers of tests/mount/posix.py run on a cuda mount, and a 2 GiB file goes in and
out with `cp`, its sha256 unchanged. The whole of tests/mount also runs on the cuda backend
with GPUMEMD_TEST_BACKEND=cuda (docs/mount.md)."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

from tests.mount import posix

pytestmark = pytest.mark.gpu

GiB = 1 << 30


@pytest.fixture(scope="module")
def cuda_mount():
    from tests.harness import Daemon, make_base_dir, usable_gpus
    if usable_gpus() == 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs a GPU and /dev/fuse")
    d = Daemon(make_base_dir(), backend="cuda", mount=True).start()
    yield d
    d.stop()
    d.cleanup()
    log = d.log()
    shutil.rmtree(d.base, ignore_errors=True)
    assert "Traceback" not in log and " ERROR: " not in log, log[-4000:]


@pytest.mark.parametrize("check", posix.ALL, ids=[f.__name__[4:] for f in posix.ALL])
def test_posix_on_cuda(cuda_mount, check):
    check(cuda_mount.mnt)
    assert os.listdir(cuda_mount.mnt) == []
    cuda_mount.cli("check", check=True)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_cp_2gib_in_and_out(cuda_mount, tmp_path):
    src = "/dev/shm/gpumem-2g.bin"
    back = "/dev/shm/gpumem-2g.back"
    subprocess.run(["dd", "if=/dev/urandom", f"of={src}", "bs=16M", "count=128"],
                   check=True, capture_output=True)
    try:
        want = sha256(src)
        on_gpu = os.path.join(cuda_mount.mnt, "big.bin")
        subprocess.run(["cp", src, on_gpu], check=True)
        info = cuda_mount.cli_json("info", "big.bin")
        assert info["size"] == 2 * GiB and info["device"].startswith("GPU-")
        assert info["capacity"] == 2 * GiB          # the growth spare was trimmed at close
        subprocess.run(["cp", on_gpu, back], check=True)
        got = sha256(back)
        print(f"cp 2 GiB in and out: sha256 {want} -> {got}")
        assert got == want
        os.unlink(on_gpu)
    finally:
        for path in (src, back):
            if os.path.exists(path):
                os.unlink(path)


def test_mmap_of_a_2gib_durable_file(cuda_mount):
    """Shared mmap through the page cache on GPU memory (issue 15): a 2 GiB durable file
    maps with its sha256 intact after the cache was dropped, and stores into the mapping
    reach the device memory at msync (the socket reads them back)."""
    import mmap
    src = "/dev/shm/gpumem-2g-mmap.bin"
    subprocess.run(["dd", "if=/dev/urandom", f"of={src}", "bs=16M", "count=128"],
                   check=True, capture_output=True)
    on_gpu = os.path.join(cuda_mount.mnt, "mapped.bin")
    try:
        want = sha256(src)
        subprocess.run(["cp", src, on_gpu], check=True)
        os.setxattr(on_gpu, "user.gpu.durable", b"1")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")                       # the mapping reads from the GPU, not cache
        with open(on_gpu, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            h = hashlib.sha256()
            for off in range(0, len(m), 64 << 20):
                h.update(m[off:off + (64 << 20)])
            got = h.hexdigest()
            m[GiB:GiB + 4096] = b"\x5a" * 4096   # a store, then msync: in device memory
            m.flush()
        print(f"mmap of 2 GiB durable: sha256 {want} -> {got}")
        assert got == want
        info = cuda_mount.cli_json("info", "mapped.bin")
        assert info["durable"] is True and info["device"].startswith("GPU-")
        back = cuda_mount.cli("read", "mapped.bin", "--offset", str(GiB), "--length", "4096",
                              check=True).stdout
        assert back == b"\x5a" * 4096
        os.unlink(on_gpu)
    finally:
        if os.path.exists(src):
            os.unlink(src)
