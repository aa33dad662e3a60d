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
