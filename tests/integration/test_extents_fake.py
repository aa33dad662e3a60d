"""Extents on the cuda backend, on the fake CUDA driver (tests/fakecuda), in CI (issue 26;
docs/storage.md, "Extents, as built"). tests/gpu/test_extents_cuda.py runs the same on a GPU.

A durable 64 MiB file on a cuda mount grown to 200 MiB gains one extent instead of being
copied, reads back byte for byte through the mount, the socket and a client's attachment
(the client maps both extents into one range), keeps both extents across a kill -9 of the
daemon, and shrinks by cutting and dropping extents; a client that does not say it maps
extents is refused with what to do; `--extents off` copies as before; and another uid
receives the object's extents and nothing else."""
from __future__ import annotations

import hashlib
import os

import pytest

from tests import fakecuda
from tests.integration.test_cuda_fake import cli, cli_json, ok, run_py

MiB = 1 << 20


@pytest.fixture
def mounted(fake_lib, daemon_factory):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")

    def make(*extra: str):
        return daemon_factory(backend="cuda", env=fakecuda.env(fake_lib), mount=True,
                              extra_args=list(extra))
    return make


def _pattern(n: int, seed: int) -> bytes:
    return hashlib.shake_256(seed.to_bytes(4, "little")).digest(n)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _grown(d) -> tuple[str, bytes]:
    """'big': 64 MiB written, durable, grown to 200 MiB with 8 MiB written at 192 MiB."""
    path = os.path.join(d.mnt, "big")
    with open(path, "wb") as f:
        os.truncate(f.fileno(), 64 * MiB)          # memory of 64 MiB at once: one extent
        f.write(_pattern(64 * MiB, 1))
    os.setxattr(path, "user.gpu.durable", b"true")
    assert "extents" not in cli_json(d, "info", "big")
    os.truncate(path, 200 * MiB)
    with open(path, "r+b") as f:
        f.seek(192 * MiB)
        f.write(_pattern(8 * MiB, 2))
    return path, _pattern(64 * MiB, 1) + bytes(128 * MiB) + _pattern(8 * MiB, 2)


ATTACH = """
    import ctypes, hashlib, gpumemctl
    with gpumemctl.attach(ARGS[0], "r", SOCK) as a:
        # On the fake driver a device pointer is a host address: read the whole range.
        data = ctypes.string_at(a.ptr, a.size)
        print(hashlib.sha256(data).hexdigest(), a.size)
"""


def test_a_grown_file_gains_an_extent_keeps_it_across_kill9_and_shrinks(mounted):
    d = mounted()
    path, want = _grown(d)
    info = cli_json(d, "info", "big")
    assert info["capacity"] == 200 * MiB and info["extents"] == [64 * MiB, 136 * MiB], info
    assert _read(path) == want
    cli(d, "verify", "big", check=0)
    digest, size = ok(run_py(d, ATTACH, "big")).split()
    assert (digest, int(size)) == (hashlib.sha256(want).hexdigest(), 200 * MiB)
    resized = [e for e in cli_json(d, "events") if e["kind"] == "resize"]
    assert resized[-1]["detail"]["capacity"] == 200 * MiB

    d.kill9()                                    # the keeper held both extents
    d.start()
    info = cli_json(d, "info", "big")
    assert info["state"] == "ready" and info["extents"] == [64 * MiB, 136 * MiB], info
    assert _read(path) == want
    cli(d, "verify", "big", check=0)

    os.truncate(path, 100 * MiB)        # the second extent cut: its first 36 MiB copied
    assert cli_json(d, "info", "big")["extents"] == [64 * MiB, 36 * MiB]
    d.kill9()
    d.start()
    assert cli_json(d, "info", "big")["extents"] == [64 * MiB, 36 * MiB]
    assert _read(path) == want[:100 * MiB]
    os.truncate(path, 64 * MiB)         # the first extent alone again
    assert "extents" not in cli_json(d, "info", "big")
    assert _read(path) == want[:64 * MiB]
    assert cli_json(d, "check")["clean"]


OLD_CLIENT = """
    from gpumemctl import Client
    from gpumemctl.protocol import InvalidState
    with Client(SOCK) as c:
        try:
            c.call_fds("attach", path=ARGS[0], mode="r", regions=True)
        except InvalidState as exc:
            print("refused:", exc)
"""


def test_a_client_that_does_not_map_extents_is_told_to_upgrade(mounted):
    d = mounted()
    _grown(d)
    out = ok(run_py(d, OLD_CLIENT, "big"))
    assert out.startswith("refused: 'big' is made of 2 extents") and \
        "upgrade gpumemctl" in out, out
    assert not cli_json(d, "info", "big").get("holders")


def test_extents_off_copies_as_before(mounted):
    d = mounted("--extents", "off")
    path, want = _grown(d)
    info = cli_json(d, "info", "big")
    assert info["capacity"] == 200 * MiB and "extents" not in info
    assert _read(path) == want


def _attach_fds(sock: str) -> dict:
    """As another uid: what `attach` of 'big' gives (fds and the extents they are)."""
    from gpumemctl import Client
    from gpumemctl.protocol import GpumemError, framing
    c = Client(sock, timeout=30)
    try:
        result, fds = c.call_fds("attach", path="big", mode="r", regions=True, extents=True)
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}
    finally:
        c.close()
    sizes = [os.fstat(fd).st_size for fd in fds]      # a fake handle's fd is its memfd
    framing.close_fds(fds)
    return {"fds": len(fds), "sizes": sizes, "extents": result["info"].get("extents")}


def test_another_uid_gets_the_extents_of_that_object_and_nothing_more(mounted):
    """Extents belong to one object each: another uid with write permission (on the cuda
    backend an fd needs it, docs/security.md) receives exactly the two extents of the
    object, whose sizes add up to its capacity; with read permission only, no fd."""
    if os.geteuid() != 0:
        pytest.skip("switching uid needs root")
    from tests.users import run_as
    d = mounted()
    path, _ = _grown(d)
    os.chmod(path, 0o666)
    got = run_as(_attach_fds, d.socket)
    assert got == {"fds": 2, "sizes": [64 * MiB, 136 * MiB],
                   "extents": [64 * MiB, 136 * MiB]}, got
    os.chmod(path, 0o644)
    got = run_as(_attach_fds, d.socket)
    assert got.get("code") == 6 and "fds" not in got, got      # permission: by copy only
