"""On a real GPU: a caller with read permission only gets no fd of cuda memory (an importer
could map it writable) and reads the bytes by copy instead (tests/security/test_cuda_fds.py
shows the same on the fake driver). Needs root to act as uid 65534."""
from __future__ import annotations

import io
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")]
DATA = os.urandom(9 << 20)          # more than two 4 MiB pieces of a copy


def _as_reader(sock: str) -> dict:
    c = Client(sock, timeout=60)
    res = {}
    for op, args in (("open", {"mode": "r"}), ("attach", {"mode": "r"}),
                     ("export_dmabuf", {})):
        try:
            _, fds = c.call_fds(op, path="shared", **args)
            res[op] = {"fds": len(fds)}
            for fd in fds:
                os.close(fd)
        except GpumemError as exc:
            res[op] = {"code": exc.code}
    out = io.BytesIO()
    res["copied"] = c.read_to("shared", out)
    res["same"] = out.getvalue() == DATA
    c.close()
    return res


def test_a_reader_gets_no_fd_of_gpu_memory_and_reads_by_copy(daemon_factory, tmp_path):
    d = daemon_factory(backend="cuda")
    src = tmp_path / "data"
    src.write_bytes(DATA)
    d.cli("create", "shared", "--size", str(len(DATA)), "--mode", "0644", check=True)
    d.cli("write", "shared", str(src), check=True)
    res = run_as(_as_reader, d.socket, timeout=120)
    assert res["open"] == {"code": 6} and res["attach"] == {"code": 6}
    assert res["export_dmabuf"]["code"] in (6, 10)     # 10: no dma-buf on this device
    assert res["copied"] == len(DATA) and res["same"] is True
    back = d.cli("read", "shared", check=True).stdout    # the owner's bytes are unchanged
    assert back == DATA
