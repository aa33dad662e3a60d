"""Read permission was write permission on GPUs (issue 14): on the cuda backend every caller
of `open`/`attach` got the same shareable fd, and an importer may map it read-write whatever
the daemon asked for (reproduced on an H100 as uid 65534). Now an fd goes only to callers with
write permission; a reader gets the bytes by copy (the `read` request, which `gpumemctl read`
and Client.read_to fall back to, or the mount), unless config `cuda_fds_to_readers` says the
administrator trusts readers with fds. Runs on the fake CUDA driver (tests/fakecuda), so the
daemon's cuda backend is the real one; tests/gpu repeats it on a GPU."""
from __future__ import annotations

import io
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError, framing
from tests import fakecuda
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
PERMISSION = 6
DATA = bytes(range(256)) * (3 * 4096 + 17)       # ~3 MiB: more than one piece of a copy


def cuda_daemon(daemon_factory, fake_lib, tmp_path, text: str = ""):
    path = tmp_path / "gpumemd.toml"
    path.write_text(text)
    d = daemon_factory(backend="cuda", env=fakecuda.env(fake_lib),
                       extra_args=["--config", str(path)])
    src = tmp_path / "data"
    src.write_bytes(DATA)
    d.cli("create", "shared", "--size", str(len(DATA)), "--mode", "0644", check=True)
    d.cli("create", "open-to-all", "--size", "1M", "--mode", "0666", check=True)
    d.cli("write", "shared", str(src), check=True, env=d.extra_env)
    return d


def attempt_fds(c: Client, op: str, **args) -> dict:
    try:
        _result, fds = c.call_fds(op, **args)
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc), "details": exc.details}
    framing.close_fds(fds)
    return {"fds": len(fds)}


def _as_reader(sock: str) -> dict:
    c = Client(sock, timeout=30)
    out = io.BytesIO()
    res = {"open_r": attempt_fds(c, "open", path="shared", mode="r"),
           "attach_r": attempt_fds(c, "attach", path="shared", mode="r"),
           "dmabuf": attempt_fds(c, "export_dmabuf", path="shared"),
           "writer_opens_r": attempt_fds(c, "open", path="open-to-all", mode="r"),
           "copied": c.read_to("shared", out),
           "tail": c.read_copy("shared", len(DATA) - 5, 100).hex()}
    res["same"] = out.getvalue() == DATA
    c.close()
    return res


def test_a_reader_gets_no_fd_on_the_cuda_backend_but_reads_by_copy(daemon_factory, fake_lib,
                                                                   tmp_path):
    d = cuda_daemon(daemon_factory, fake_lib, tmp_path)
    res = run_as(_as_reader, d.socket)
    for op in ("open_r", "attach_r", "dmabuf"):
        assert res[op]["code"] == PERMISSION, (op, res[op])
    assert "would let uid 65534 write it" in res["open_r"]["message"]
    assert res["open_r"]["details"]["by_copy"] is True
    assert res["writer_opens_r"] == {"fds": 1}    # write permission: an fd, even for "r"
    assert res["copied"] == len(DATA) and res["same"] is True
    assert res["tail"] == DATA[-5:].hex()
    proc = d.cli("read", "shared", "--offset", "1000", "--length", "10", check=True,
                 env=d.extra_env)
    assert proc.stdout == DATA[1000:1010]         # root, through its fd, as before


def _open_r(sock: str) -> dict:
    c = Client(sock, timeout=30)
    res = attempt_fds(c, "open", path="shared", mode="r")
    c.close()
    return res


def test_the_administrator_may_trust_readers_with_fds(daemon_factory, fake_lib, tmp_path):
    d = cuda_daemon(daemon_factory, fake_lib, tmp_path, "cuda_fds_to_readers = true\n")
    assert run_as(_open_r, d.socket) == {"fds": 1}


def _read_range(sock: str) -> dict:
    c = Client(sock, timeout=30)
    res = {"past_end": c.read_copy("shared", 1 << 40, 10).hex()}
    try:
        c.read_copy("shared", -1, 10)
    except GpumemError as exc:
        res["negative"] = {"code": exc.code, "message": str(exc)}
    try:
        c.read_copy("nothing-here", 0, 10)
    except GpumemError as exc:
        res["missing"] = exc.code
    c.close()
    return res


def test_read_by_copy_takes_bad_ranges_cleanly(daemon_factory, fake_lib, tmp_path):
    d = cuda_daemon(daemon_factory, fake_lib, tmp_path)
    res = run_as(_read_range, d.socket)
    assert res["past_end"] == ""
    assert res["negative"]["code"] == 2 and "offset -1" in res["negative"]["message"]
    assert res["missing"] == 4
