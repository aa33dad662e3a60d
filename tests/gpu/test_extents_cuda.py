"""Extents on a real GPU (issue 26, docs/storage.md "Extents, as built"): a durable file of
64 MiB on a cuda mount grown to 200 MiB keeps its memory and gains one extent (no copy of
its bytes: the first extent is the same cuMemCreate handle), is read back byte for byte
through the mount, the socket and a client's attachment (the client maps both extents
into one range), survives a kill -9 of the daemon as the same two extents, and shrinks
by dropping and cutting extents. A client that does not map extents is refused with the
next step to take."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from gpumemctl.protocol import InvalidState

pytestmark = pytest.mark.gpu

MiB = 1 << 20


@pytest.fixture
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


def _pattern(n: int, seed: int) -> bytes:
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 2048
    return bytes(out[:n])


def _info(d, name: str) -> dict:
    return json.loads(d.cli("info", name, "--json", check=0).stdout)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_file_grown_on_a_gpu_gains_an_extent_and_keeps_its_bytes(cuda_mount):
    d = cuda_mount
    path = os.path.join(d.mnt, "big")
    head, tail = _pattern(64 * MiB, 1), _pattern(8 * MiB, 2)
    with open(path, "wb") as f:
        os.truncate(f.fileno(), 64 * MiB)        # memory of 64 MiB at once: one extent
        f.write(head)
    os.setxattr(path, "user.gpu.durable", b"true")
    assert "extents" not in _info(d, "big")
    os.truncate(path, 200 * MiB)                 # grown: one extent more, no copy
    with open(path, "r+b") as f:
        f.seek(192 * MiB)
        f.write(tail)
    info = _info(d, "big")
    assert info["capacity"] == 200 * MiB and info["extents"] == [64 * MiB, 136 * MiB], info
    want = head + bytes(128 * MiB) + tail
    assert hashlib.sha256(_read_file(path)).digest() == hashlib.sha256(want).digest()
    d.cli("verify", "big", check=0)
    with d.client() as c:
        assert c.read("big", offset=190 * MiB, length=10 * MiB) == want[190 * MiB:]
        att = c.attach("big")                    # both extents in one range of this process
        try:
            assert att.read(60 * MiB, 8 * MiB) == want[60 * MiB:68 * MiB]
            assert att.read(192 * MiB, 8 * MiB) == tail
        finally:
            att.detach()
        # A client that does not map extents (an older gpumemctl) is told what to do.
        with pytest.raises(InvalidState, match="upgrade gpumemctl"):
            c.call_fds("attach", path="big", mode="r", regions=True)

    d.kill9()                                    # the keeper held both extents
    d.start()
    info = _info(d, "big")
    assert info["state"] == "ready" and info["extents"] == [64 * MiB, 136 * MiB], info
    assert hashlib.sha256(_read_file(path)).digest() == hashlib.sha256(want).digest()
    d.cli("verify", "big", check=0)

    os.truncate(path, 100 * MiB)     # the second extent cut: its first 36 MiB copied
    info = _info(d, "big")
    assert info["capacity"] == 100 * MiB and info["extents"] == [64 * MiB, 36 * MiB], info
    d.kill9()
    d.start()
    assert _info(d, "big")["extents"] == [64 * MiB, 36 * MiB]
    assert _read_file(path) == want[:100 * MiB]
    os.truncate(path, 64 * MiB)      # back to the first extent alone
    assert "extents" not in _info(d, "big")
    assert _read_file(path) == head
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]
