"""A stand-in for KvikIO's Python API (`kvikio.CuFile`, `kvikio.defaults`), as much of it
as gpumemctl/snapshots/gds.py uses, for tests on the fake CUDA driver (tests/fakecuda),
whose device memory is a host mapping: a CuFile opens its file by path with KvikIO's flags
and copies between the file and "device" pointers with pread/pwrite. Each path it is given
is appended to $FAKE_KVIKIO_LOG, so a test sees what KvikIO would open.

Put tests/fakekvikio first on PYTHONPATH of the gpumemctl child, with
GPUMEMCTL_SNAPSHOT_IO=kvikio (tests/integration/test_snapshot_kvikio_fake.py)."""
from __future__ import annotations

import ctypes
import os

from . import defaults  # noqa: F401 - gds.py imports kvikio.defaults

_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          "r+": os.O_RDWR, "w+": os.O_RDWR | os.O_CREAT | os.O_TRUNC}


class _Done:
    """What KvikIO's pread/pwrite return: a future whose get() is the bytes moved."""

    def __init__(self, n: int):
        self.n = n

    def get(self) -> int:
        return self.n


def _pointer(buf) -> int:
    return buf.__cuda_array_interface__["data"][0]


class CuFile:
    def __init__(self, file, flags: str = "r"):
        log = os.environ.get("FAKE_KVIKIO_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{os.fspath(file)} {flags}\n")
        self._fd = os.open(file, _FLAGS[flags] | os.O_CLOEXEC, 0o644)
        self.closed = False

    def pwrite(self, buf, size: int, file_offset: int = 0) -> _Done:
        return _Done(os.pwrite(self._fd, ctypes.string_at(_pointer(buf), size), file_offset))

    def pread(self, buf, size: int, file_offset: int = 0) -> _Done:
        data = os.pread(self._fd, size, file_offset)
        ctypes.memmove(_pointer(buf), data, len(data))
        return _Done(len(data))

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
            self.closed = True

    def __enter__(self) -> CuFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
