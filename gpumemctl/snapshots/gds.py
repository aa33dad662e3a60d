"""The cuda backend's snapshot data path through KvikIO (docs/snapshots.md, "Data paths").

With KvikIO (`kvikio-cu13`) importable, a snapshot of GPU memory to a directory, and a
restore from one, move the data between the file and the device with `kvikio.CuFile`:
GPUDirect Storage (cuFile DMA between storage and GPU memory, no host copy) where the
platform has it (an NVMe or a parallel file system with GDS support and the nvidia-fs
module), KvikIO's POSIX compatibility mode where not (its thread pool copying through its
own pinned bounce buffers). The block checksums are computed on the host from a separate
device-to-host pass through the pinned staging buffers (gpumemctl.cudadrv.Stager), which
overlaps the file I/O.

Which path runs (`GPUMEMCTL_SNAPSHOT_IO`):
    auto     KvikIO where GDS is available, else the staged path (the default: in
             compatibility mode KvikIO copies through the host as the staged path does,
             and the staged path's one device-to-host pass serves both the file and the
             checksums; bench/snapshot.py measures both)
    kvikio   KvikIO whenever it is importable (compatibility mode included)
    staged   pinned staging buffers and parallel pwrite/pread (gpumemctl.memory)
What ran is reported as `io`: `gds` (cuFile), `posix` (KvikIO's compatibility mode or the
staged path) or `s3`.
"""
from __future__ import annotations

import os

from ..protocol import UsageError

MODE_ENV = "GPUMEMCTL_SNAPSHOT_IO"
MODES = ("auto", "kvikio", "staged")
CHUNK = 256 << 20          # bytes per KvikIO call (it splits them into its own tasks)


def requested() -> str:
    mode = os.environ.get(MODE_ENV, "auto") or "auto"
    if mode not in MODES:
        raise UsageError(f"invalid {MODE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _kvikio():
    try:
        import kvikio
        import kvikio.defaults
    except ImportError:
        return None
    return kvikio


def gds_available() -> bool:
    """KvikIO would use cuFile (not its compatibility mode)."""
    kvikio = _kvikio()
    return kvikio is not None and not kvikio.defaults.is_compat_mode_preferred()


def use_kvikio(memory, store) -> bool:
    """Whether this allocation's data goes through KvikIO (module docstring)."""
    if store.kind != "dir" or not hasattr(memory, "ptr"):
        return False
    mode = requested()
    if mode == "staged":
        return False
    if _kvikio() is None:
        if mode == "kvikio":
            raise UsageError(f"{MODE_ENV}=kvikio, but KvikIO is not installed (pip install "
                             "kvikio-cu13)")
        return False
    return mode == "kvikio" or gds_available()


def io_kind(store, kvikio_used: bool = False) -> str:
    """What moved the data: `s3`, `gds` (cuFile) or `posix` (docs/snapshots.md)."""
    if store.kind == "s3":
        return "s3"
    return "gds" if kvikio_used and gds_available() else "posix"


class DeviceSpan:
    """`n` bytes of device memory at `ptr`, as KvikIO takes a device buffer."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3}


class DeviceWriter:
    """A data object written from device memory by KvikIO, in order. The file is the store's
    (a DirWriter: made with O_EXCL under a temporary name, by directory descriptor) and
    KvikIO opens it through /proc/self/fd, never through its name in the store; committed
    as the staged writer's are (fsync, then rename into place)."""

    def __init__(self, store, key: str, device: int):
        from .. import cudadrv
        self.cu, self.device = cudadrv, device
        self.file = store.writer(key)
        self.where = store.where(key)
        try:
            self.f = _kvikio().CuFile(self.file.proc_path, "w")
        except BaseException:
            self.file.abort()
            raise
        self.offset = 0

    def write_device(self, ptr: int, n: int) -> int:
        at = self.offset
        with self.cu.context(self.device):
            done = self.f.pwrite(DeviceSpan(ptr, n), n, at).get()
        if done != n:
            raise OSError(f"KvikIO wrote {done} of {n} bytes to {self.where}")
        self.offset += n
        return at

    def commit(self) -> None:
        self.f.close()
        self.file.commit()

    def abort(self) -> None:
        if not self.f.closed:
            self.f.close()
        self.file.abort()


def read_device(path: str, device: int, ptr: int, n: int, offset: int) -> int:
    """Read `n` bytes of the file at `offset` into device memory; returns the bytes read.
    `path`: the /proc/self/fd path of a reader the store opened and checked (DirReader)."""
    from .. import cudadrv
    with cudadrv.context(device), _kvikio().CuFile(path, "r") as f:
        return f.pread(DeviceSpan(ptr, n), n, offset).get()
