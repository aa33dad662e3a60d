"""How a client reaches an allocation's memory once gpumemd has passed it the fd.

- host backend: the fd is a memfd. `HostMemory` maps it with mmap: zero-copy, and a read-only
  open gets an O_RDONLY fd, mapped PROT_READ.
- cuda backend: the fd is an exported CUDA VMM allocation. `CudaMemory` imports it, maps it
  into this process's primary context of the allocation's device (read-only access for a
  read-only open: the fd itself cannot say so) and copies through pinned staging buffers,
  chunked and overlapped (gpumemctl.cudadrv.Stager). CUDA is imported only here, and only
  when the daemon runs the cuda backend.

Both offer the same operations: read/write of a range as bytes, and read_to/write_from a file
object with a progress callback. attach() maps host memory with gpumemctl/hostmap.py.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import stat
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:       # imported where used: `gpumemctl ls` loads this module, too
    from concurrent.futures import ThreadPoolExecutor

    from .protocol.replies import Allocation

from .protocol import InternalError, InvalidState, ProtocolError, framing

HOST_CHUNK = 8 << 20     # per write() to a file object on the host path
CUDA_CHUNK = 64 << 20    # per pinned staging buffer (two of them, overlapped)
# A regular file of PIPELINE_MIN bytes or more is written through PIPELINE_DEPTH buffers of
# PIPELINE_CHUNK, read in PIPELINE_PIECEs with those of all buffers but two in flight
# (CudaMemory._write_pipelined). Measured on an H200 from /dev/shm: 44-54 GB/s against 27-30
# for the two-buffer path, with the pinned copy at 55 (docs/tensors.md, "Figures").
PIPELINE_MIN = 256 << 20
PIPELINE_CHUNK = 32 << 20
PIPELINE_DEPTH = 6
PIPELINE_PIECE = 8 << 20
SNAPSHOT_CHUNK = 256 << 20   # drain/fill's pieces on the host backend (gpumemctl snapshot)

Advance = Callable[[int], None]    # called with the bytes moved so far


def region_of(info) -> tuple[int, int | None]:
    """(offset, span) of the allocation in the memory its fd holds: a small allocation in
    its owner's slab lies at `region.offset` of `region.span` bytes (docs/storage.md); any
    other is the whole of it, (0, None)."""
    region = info.get("region") or {}
    return int(region.get("offset", 0)), region.get("span")


def open_memory(backend: str, fds: list[int], info: Allocation, writable: bool):
    """Map the memory behind `fds` (taking ownership of them): one fd, or one per extent
    (`extents_of(info)`)."""
    if backend == "cuda":
        return CudaMemory(fds, info, writable)
    return HostMemory(fds[0], info["capacity"], writable,  # type: ignore[arg-type]
                      region_of(info)[0])


def expect_fds(op: str, info, fds: list[int]) -> None:
    """ProtocolError (closing `fds`) unless the answer brought one fd per extent: the
    sizes in info's `extents`, where the memory is several (docs/protocol.md, "Extents")."""
    expected = len(info.get("extents") or [0])
    if len(fds) != expected:
        framing.close_fds(fds)
        raise ProtocolError(f"'{op}' answered with {len(fds)} fds, expected {expected}")


# Regular files move through the staging buffers in parallel pieces (preadv/pwrite release the
# GIL): one thread copying from the page cache reaches only a fraction of a PCIe link.
PIECE = 4 << 20
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _io_pool() -> ThreadPoolExecutor:
    global _pool
    from concurrent.futures import ThreadPoolExecutor
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                                       thread_name_prefix="gpumemctl-io")
        return _pool


def _regular_fd(f, *, writing: bool = False) -> int | None:
    """The fd of a regular file we may address by offset (not a pipe, tty or O_APPEND)."""
    try:
        fd = f.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if writing and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
            return None
        return fd
    except (AttributeError, OSError, ValueError):
        return None


def _pieces(view: memoryview, base: int):
    return [(view[o:o + PIECE], base + o) for o in range(0, len(view), PIECE)]


def _pread_full(fd: int, piece: memoryview, offset: int) -> int:
    got = 0
    while got < len(piece):
        n = os.preadv(fd, [piece[got:]], offset + got)
        if not n:
            break
        got += n
    return got


def _pwrite_full(fd: int, piece: memoryview, offset: int) -> None:
    done = 0
    while done < len(piece):
        done += os.pwrite(fd, piece[done:], offset + done)


def _parallel(fn, view: memoryview, fd: int, base: int) -> list:
    jobs = _pieces(view, base)
    if len(jobs) == 1:
        return [fn(fd, *jobs[0])]
    return list(_io_pool().map(lambda job: fn(fd, *job), jobs))


def _fill_from(src: BinaryIO, view: memoryview) -> int:
    """Read from src until `view` is full or the input ends; returns the bytes put."""
    got = 0
    readinto = getattr(src, "readinto", None)
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = src.read(len(view) - got)
            n = len(data)
            view[got:got + n] = data
        if not n:
            break
        got += n
    return got


class HostMemory:
    def __init__(self, fd: int, capacity: int, writable: bool, offset: int = 0):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            self.map = mmap.mmap(fd, capacity, mmap.MAP_SHARED, prot, offset=offset)
        finally:
            os.close(fd)
        self.writable = writable

    def read(self, offset: int, length: int) -> bytes:
        return self.map[offset:offset + length]

    def write(self, offset: int, data) -> None:
        self.map[offset:offset + len(data)] = data

    def read_to(self, out: BinaryIO, offset: int, length: int, advance: Advance) -> int:
        done = 0
        view = memoryview(self.map)
        try:
            while done < length:
                n = min(HOST_CHUNK, length - done)
                out.write(view[offset + done:offset + done + n])
                done += n
                advance(done)
        finally:
            view.release()
        return done

    def write_from(self, src: BinaryIO, offset: int, limit: int, advance: Advance) -> bool:
        """Copy src into [offset, offset+limit). True when src held more than `limit` bytes
        (nothing past the limit is written)."""
        done = 0
        view = memoryview(self.map)
        try:
            while True:
                room = limit - done
                chunk = src.read(min(HOST_CHUNK, room + 1) if room >= 0 else 1)
                if not chunk:
                    return False
                if len(chunk) > room:
                    return True
                view[offset + done:offset + done + len(chunk)] = chunk
                done += len(chunk)
                advance(done)
        finally:
            view.release()

    def drain(self, offset: int, length: int, sink: Callable[[int, memoryview], None],
              chunk: int = SNAPSHOT_CHUNK) -> None:
        """Hand [offset, offset+length) to `sink(offset, view)` in order, chunk by chunk:
        views of the mapping itself (zero-copy), valid only during the call."""
        view = memoryview(self.map)
        try:
            for at in range(offset, offset + length, chunk):
                sink(at, view[at:min(at + chunk, offset + length)])
        finally:
            view.release()

    def fill(self, offset: int, length: int, source: Callable[[int, memoryview], None],
             chunk: int = SNAPSHOT_CHUNK) -> None:
        """Let `source(offset, view)` fill [offset, offset+length) chunk by chunk, writing
        straight into the mapping."""
        if not self.writable:
            raise InvalidState("mapped read-only: writing is not allowed")
        view = memoryview(self.map)
        try:
            for at in range(offset, offset + length, chunk):
                source(at, view[at:min(at + chunk, offset + length)])
        finally:
            view.release()

    def close(self) -> None:
        if self.writable:
            self.map.flush()
        self.map.close()


# Full-size staging buffers are kept for reuse: pinning 2 x 64 MiB costs tens of ms, as much
# as moving a GiB, and a process that transfers once usually transfers again. At most
# MAX_IDLE_STAGERS per device stay pinned while idle (freed at exit).
MAX_IDLE_STAGERS = 2
_idle_stagers: dict[tuple[int, int, int], list] = {}    # (device, chunk, depth)
_stager_lock = threading.Lock()


def _take_stager(cu, device: int, chunk: int, depth: int = 2):
    with _stager_lock:
        idle = _idle_stagers.get((device, chunk, depth))
        if idle:
            return idle.pop()
    return cu.Stager(device, chunk=chunk, depth=depth)


def _return_stager(stager, device: int, chunk: int, keep: bool, depth: int = 2) -> None:
    if keep:
        with _stager_lock:
            idle = _idle_stagers.setdefault((device, chunk, depth), [])
            if len(idle) < MAX_IDLE_STAGERS:
                idle.append(stager)
                return
    stager.close()


def warm_up(device: str | int) -> threading.Thread:
    """Create the device's primary context and the pinned buffers of a large file's write
    (_write_pipelined) on a thread, while the caller does other work (`gpumemctl load`
    checks its files meanwhile): both cost hundreds of ms the first time in a process.
    Errors are left for the real use to raise."""
    def warm() -> None:
        try:
            from . import cudadrv
            index = cudadrv.device_index(device)
            cudadrv.primary_context(index)
            stager = _take_stager(cudadrv, index, PIPELINE_CHUNK, PIPELINE_DEPTH)
            _return_stager(stager, index, PIPELINE_CHUNK, keep=True, depth=PIPELINE_DEPTH)
        except Exception:   # noqa: BLE001 - only a head start; the transfer reports errors
            pass
    thread = threading.Thread(target=warm, name="gpumemctl-cuda-warm-up", daemon=True)
    thread.start()
    return thread


class CudaMemory:
    """An allocation on a GPU, mapped into this process (see the module docstring)."""

    def __init__(self, fds: list[int], info: Allocation, writable: bool,
                 chunk: int = CUDA_CHUNK):
        try:
            from . import cudadrv
        except ImportError as exc:  # pragma: no cover - cudadrv itself imports nothing
            raise InternalError(f"cannot load gpumemctl.cudadrv: {exc}") from None
        self.cu, self.chunk, self.writable = cudadrv, chunk, writable
        self.capacity: int = info["capacity"]  # type: ignore[assignment]  # open: not pending
        self._stager = None
        # A slot's fd is its slab's (region_of): the slab is mapped whole, as a CUDA handle
        # maps only from offset 0, and the allocation begins `offset` bytes into it. Memory
        # of several extents: each fd mapped after the one before, into one range.
        try:
            self.device = cudadrv.device_index(info["device"])  # type: ignore[arg-type]
            pieces = self._import(fds, info)
            try:
                self.mapping = cudadrv.Mapping(pieces, sum(n for _, n in pieces),
                                               self.device, writable)
            except BaseException:
                self._release([h for h, _ in pieces])
                raise
        except (cudadrv.CudaError, ValueError) as exc:
            raise _client_error(info, exc) from None
        finally:
            for fd in fds:
                os.close(fd)
        offset, self._span = region_of(info)
        self.ptr = self.mapping.ptr + offset

    def _import(self, fds: list[int], info: Allocation) -> list[tuple[int, int]]:
        """(handle, bytes) of each fd (which stays the caller's to close), in order."""
        span = region_of(info)[1]
        sizes = info.get("extents") or [span or info["capacity"]]  # type: ignore[list-item]
        handles: list[int] = []
        try:
            with self.cu.context(self.device):
                for fd in fds:
                    handles.append(self.cu.import_fd(fd))
            return list(zip(handles, sizes, strict=True))
        except BaseException:
            self._release(handles)
            raise

    def _release(self, handles: list[int]) -> None:
        if handles:
            with self.cu.context(self.device):
                for handle in handles:
                    self.cu.release(handle)

    def park(self) -> None:
        """Give the memory back, keeping the address (Mapping.park). A slot of a slab cannot
        be parked: its address lies inside a slab that other allocations share."""
        if self._span is not None:
            raise InvalidState("a small allocation packed in a slab cannot keep its address "
                               "while asleep: detach it first")
        self.mapping.park()

    def remap(self, fds: list[int], info: Allocation) -> None:
        """Map the allocation's memory now (after a wake: `fds` as attach sends them, closed
        here) at the address it had."""
        try:
            if region_of(info) != (0, None):
                raise InvalidState(f"'{info.get('path')}' woke as a slot of a slab: it "
                                   "cannot be mapped at the address it had")
            if self.cu.device_index(info["device"]) != self.device:  # type: ignore[arg-type]
                raise InvalidState(f"'{info.get('path')}' woke on another GPU "
                                   f"({info.get('device')}), away from its address here")
            pieces = self._import(fds, info)
            try:
                self.mapping.remap(pieces)
            except BaseException:
                self._release([h for h, _ in pieces])
                raise
        except (self.cu.CudaError, ValueError) as exc:
            raise _client_error(info, exc) from None
        finally:
            for fd in fds:
                os.close(fd)

    def stager(self, length: int):
        """Staging buffers sized for the first transfer (small reads pin little memory)."""
        if self._stager is None:
            size = min(self.chunk, max(1 << 20, -(-length // (1 << 20)) * (1 << 20)))
            self._stager = _take_stager(self.cu, self.device, size)
        return self._stager

    def read(self, offset: int, length: int) -> bytes:
        return self.stager(length).read_bytes(self.ptr + offset, length)

    def write(self, offset: int, data) -> None:
        self._require_writable()
        self.stager(len(memoryview(data).cast("B"))).write_bytes(self.ptr + offset, data)

    def read_to(self, out: BinaryIO, offset: int, length: int, advance: Advance) -> int:
        done = 0
        out.flush()
        fd = _regular_fd(out, writing=True)
        base = out.tell() if fd is not None else 0

        def drain(view: memoryview) -> None:
            nonlocal done
            if fd is None:
                out.write(view)
            else:
                _parallel(_pwrite_full, view, fd, base + done)
            done += len(view)
            advance(done)

        try:
            if length:
                self.stager(length).download(self.ptr + offset, length, drain)
        finally:
            if fd is not None:
                out.seek(base + done)
        return done

    def write_from(self, src: BinaryIO, offset: int, limit: int, advance: Advance) -> bool:
        """As HostMemory.write_from: True when src held more than `limit` bytes."""
        self._require_writable()
        fd = _regular_fd(src)
        base = src.tell() if fd is not None else 0
        if fd is not None:
            length = max(0, min(os.fstat(fd).st_size - base, limit))
            if length >= PIPELINE_MIN:
                self._write_pipelined(fd, base, offset, length, advance)
                src.seek(base + length)
                return os.fstat(fd).st_size - base > limit
        done = 0

        def fill(view: memoryview) -> int:
            nonlocal done
            if fd is None:
                n = _fill_from(src, view)
            else:
                want = max(0, min(len(view), os.fstat(fd).st_size - (base + done)))
                n = sum(_parallel(_pread_full, view[:want], fd, base + done)) if want else 0
            if n:
                done += n
                advance(done)
            return n

        try:
            if limit > 0:
                self.stager(limit).upload(self.ptr + offset, fill, limit)
        finally:
            if fd is not None:
                src.seek(base + done)
        if done < max(limit, 0):
            return False           # the input ended inside the allocation
        return bool(src.read(1))

    def _write_pipelined(self, fd: int, base: int, offset: int, length: int,
                         advance: Advance) -> None:
        """File bytes [base, base+length) to `offset` through PIPELINE_DEPTH pinned buffers,
        the reads of several of them in flight at once (cudadrv.Stager.upload_pieces)."""
        pool = _io_pool()

        def piece(view: memoryview, at: int) -> None:
            if _pread_full(fd, view, at) != len(view):
                raise InvalidState(f"the input file ended before byte {at + len(view)}: it "
                                   "changed while it was read")

        def read(view: memoryview, at: int) -> list:
            return [pool.submit(piece, view[o:o + PIPELINE_PIECE], base + at + o)
                    for o in range(0, len(view), PIPELINE_PIECE)]

        stager = _take_stager(self.cu, self.device, PIPELINE_CHUNK, PIPELINE_DEPTH)
        try:
            stager.upload_pieces(self.ptr + offset, length, read, advance)
        finally:
            _return_stager(stager, self.device, PIPELINE_CHUNK, keep=True,
                           depth=PIPELINE_DEPTH)

    def drain(self, offset: int, length: int, sink: Callable[[int, memoryview], None]) -> None:
        """As HostMemory.drain, through the pinned staging buffers: `view` is a pinned
        buffer, reused once `sink` returns, while the next chunk's copy is in flight."""
        at = offset

        def each(view: memoryview) -> None:
            nonlocal at
            sink(at, view)
            at += len(view)

        if length:
            self.stager(length).download(self.ptr + offset, length, each)

    def fill(self, offset: int, length: int, source: Callable[[int, memoryview], None]) -> None:
        """As HostMemory.fill: `source` fills a pinned buffer, copied to the device while
        the next one is filled."""
        self._require_writable()
        at = offset

        def each(view: memoryview) -> int:
            nonlocal at
            source(at, view)
            at += len(view)
            return len(view)

        if length:
            self.stager(length).upload(self.ptr + offset, each, length)

    def _require_writable(self) -> None:
        if not self.writable:
            raise InvalidState("mapped read-only: writing is not allowed")

    def close(self) -> None:
        if self._stager is not None:
            _return_stager(self._stager, self.device, self._stager.chunk,
                           keep=self._stager.chunk == CUDA_CHUNK)
            self._stager = None
        self.mapping.close()


def __getattr__(name: str):
    """HostMapping, from gpumemctl/hostmap.py (imported when asked for: it loads ctypes)."""
    if name == "HostMapping":
        from .hostmap import HostMapping
        return HostMapping
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _client_error(info: Allocation, exc) -> Exception:
    """A CUDA failure on the client side, as one line for the user."""
    from . import cudadrv
    what = f"'{info.get('path')}' lives on GPU {info.get('device')} (cuda backend)"
    if isinstance(exc, (cudadrv.CudaUnavailable, cudadrv.CudaInvalidDevice,
                        cudadrv.CudaNoDevice)):
        return InvalidState(f"{what}, which this process cannot reach: {exc}")
    return InternalError(f"{what}; mapping it here failed: {exc}")
