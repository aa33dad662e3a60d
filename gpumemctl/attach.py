"""`gpumemctl.attach(name, mode)`: map an allocation into this process and use it in place.

    with gpumemctl.attach("models/llama", "r") as a:
        weights = torch.from_dlpack(a)          # or cupy.from_dlpack(a), numpy on the host
        ...

The daemon passes the allocation's fd (op `attach`) and records a holder `attach-r` or
`attach-w` in this connection's session: one writer or many readers, as for open handles, and
a crash of this process ends the session and releases the lock at once.

- cuda backend: the fd is imported (cuMemImportFromShareableHandle) and mapped into the
  primary context of the allocation's device, which PyTorch and CuPy use too; access is
  read-only for "r" (cuMemSetAccess PROT_READ: a kernel that stores to it faults).
  `.ptr` is a device pointer, `.device` the device's ordinal in *this* process (it depends on
  CUDA_VISIBLE_DEVICES; `.device_uuid` does not).
- host backend: the memfd is mmap'ed (PROT_READ for "r"), `.ptr` is a host address and the
  object speaks `__array_interface__` instead of `__cuda_array_interface__`.

Lifetime: every DLPack export is counted, and detach() (or leaving the `with` block) while
tensors made by from_dlpack are alive only marks the attachment for detaching: the memory
stays mapped, and the lock held, until the last of them is freed. Views made through
`__cuda_array_interface__` / `__array_interface__` are not counted: do not use them after
detach(). A read-write attachment leaves the allocation `unsealed` until detach() or seal().

Sleep and wake (gpumemctl/sleepwake.py): park() gives the memory back but keeps its address
range reserved, and resume() maps the allocation's memory after a wake at the same address, so
pointers and tensors made before stay valid (while parked, touching them faults). Every live
attachment is in a registry of this process (`live()`), where Client.sleep finds those of the
allocations it puts to sleep, whoever made them (gpumemctl.tensors.load's included).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import weakref

from . import dlpack
from .client import Client
from .hostmap import HostMapping
from .memory import CudaMemory, expect_fds, region_of
from .protocol import InvalidState, NotRunning, UsageError, out_of_range

# Every attachment of this process that is not finished, by weak reference: one whose DLPack
# exports are alive is kept alive by them (gpumemctl/dlpack.py), however it was made.
_registry: weakref.WeakSet[Attachment] = weakref.WeakSet()
_registry_lock = threading.Lock()


def live(socket_path: str) -> list[Attachment]:
    """This process's attachments through the daemon at `socket_path` not yet finished
    (detach() deferred by live exports included). Not those a forked child inherited: they
    are its parent's holders, which the child cannot speak for."""
    key, pid = os.path.realpath(socket_path), os.getpid()
    with _registry_lock:
        return [a for a in _registry if a._socket_key == key and a._pid == pid]


class SharedClient:
    """One connection that several attachments share, each closing its share of it: the
    last close() closes the connection (gpumemctl.tensors.load attaches every shard of a
    model through the connection that listed them: one connect for the whole model). Its
    maker holds the first share. Everything else is the Client's."""

    def __init__(self, client: Client):
        self._client, self._shares, self._share_lock = client, 1, threading.Lock()

    def take(self) -> SharedClient:
        with self._share_lock:
            if self._shares <= 0:
                raise UsageError("the shared connection is closed")
            self._shares += 1
        return self

    def close(self) -> None:
        with self._share_lock:
            self._shares -= 1
            last = self._shares == 0
        if last:
            self._client.close()

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def attach(name: str, mode: str = "r", socket: str | None = None, *,
           client: Client | SharedClient | None = None) -> Attachment:
    """Map allocation `name` into this process, read-only ("r") or read-write ("rw").
    Without `client`, the attachment opens (and later closes) its own connection; with a
    SharedClient it takes a share of that one (closed with the attachment)."""
    own = client is None or isinstance(client, SharedClient)
    conn: Client | SharedClient
    if client is None:
        conn = Client(socket, client_name="gpumemctl.attach")
    else:
        conn = client.take() if isinstance(client, SharedClient) else client
    try:
        result, fds = conn.call_fds("attach", path=name, mode=mode, regions=True,
                                    extents=True)
    except BaseException:
        if own:
            conn.close()
        raise
    try:
        expect_fds("attach", result["info"], fds)
        return Attachment(conn, own, result, fds, mode)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.call("detach", handle=result["handle"])
        if own:
            conn.close()
        raise


class Attachment:
    """An allocation mapped into this process. See the module docstring."""

    def __init__(self, client: Client | SharedClient, own_client: bool, result: dict,
                 fds: list[int], mode: str):
        info = result["info"]
        self.info, self.name, self.mode = info, info["path"], mode
        self.writable = mode == "rw"
        self.size, self.capacity, self.device_uuid = info["size"], info["capacity"], \
            info["device"]
        self.backend = result.get("backend") or client.hello.get("backend", "host")
        self._client, self._own_client, self._holder = client, own_client, result["handle"]
        self.socket_path = client.socket_path      # the daemon's, for Client.sleep/wake
        self._socket_key, self._pid = os.path.realpath(client.socket_path), os.getpid()
        self._lock = threading.Lock()
        self._map_lock = threading.Lock()   # the mapping's park, resume and close
        self._exports = 0
        self._pending = False          # detach() asked while DLPack exports were alive
        self._detached = False
        self._parked = False           # park()ed: the address kept, nothing mapped
        self._memory: CudaMemory | HostMapping
        if self.backend == "cuda":
            self._memory = CudaMemory(fds, info, self.writable)
        else:
            self._memory = HostMapping(fds[0], info["capacity"], self.writable,
                                       region_of(info)[0])
        self.ptr: int = self._memory.ptr
        self.device: int = self._memory.device
        with _registry_lock:
            _registry.add(self)

    def __repr__(self) -> str:
        state = "detached" if self._detached else "parked" if self._parked else "attached"
        return (f"<gpumemctl.Attachment {self.name!r} mode={self.mode} size={self.size} "
                f"{self.backend} device={self.device} ptr={self.ptr:#x} {state}>")

    # ---- array protocols ------------------------------------------------------------------
    def _interface(self) -> dict:
        self._require_attached()
        return {"version": 3, "shape": (self.size,), "typestr": "|u1",
                "data": (self.ptr, not self.writable), "strides": None}

    @property
    def __cuda_array_interface__(self) -> dict:
        if self.backend != "cuda":
            raise AttributeError("host memory has no __cuda_array_interface__; use "
                                 "__array_interface__ or DLPack")
        return {**self._interface(), "stream": None}    # no work of ours is in flight

    @property
    def __array_interface__(self) -> dict:
        if self.backend == "cuda":
            raise AttributeError("GPU memory has no __array_interface__; use "
                                 "__cuda_array_interface__ or DLPack")
        return self._interface()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.backend == "cuda":
            return dlpack.kDLCUDA, self.device
        return dlpack.kDLCPU, 0

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the whole allocation (uint8, shape (size,)). `stream` needs
        no action: nothing of ours is in flight on any stream. On the GPU the capsule is the
        unversioned kind every consumer takes; on the host a consumer that accepts DLPack
        1.0 gets the read-only flag for a read-only attachment."""
        if copy:
            raise BufferError("gpumemctl attachments export in place; copy=True is not "
                              "supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the memory is on {self.__dlpack_device__()}, not {dl_device}")
        versioned = (self.backend != "cuda" and max_version is not None
                     and max_version[0] >= 1)
        return self._capsule(0, self.size, versioned)

    # ---- data convenience (copies) ---------------------------------------------------------
    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        length = self.size - offset if length is None else length
        self._check_range(offset, length)
        return self._memory.read(offset, length)

    def write(self, data, offset: int = 0) -> None:
        if not self.writable:
            raise UsageError(f"'{self.name}' is attached read-only")
        self._check_range(offset, len(data), writing=True)
        self._memory.write(offset, data)

    def _check_range(self, offset: int, length: int, *, writing: bool = False) -> None:
        self._require_attached()
        if offset < 0 or length < 0 or offset + length > self.size:
            raise out_of_range(self.name, offset, length, self.size, writing=writing)

    # ---- lifetime -----------------------------------------------------------------------------
    @property
    def detached(self) -> bool:
        return self._detached

    def _require_attached(self) -> None:
        if self._detached or self._pending:
            raise UsageError(f"'{self.name}' has been detached")
        if self._parked:
            raise InvalidState(f"'{self.name}' is asleep: Client.wake maps its memory here "
                               "again (or resume(), where it was woken by another)")

    # ---- sleep and wake (gpumemctl/sleepwake.py) -------------------------------------------
    @property
    def parked(self) -> bool:
        return self._parked

    def park(self) -> int:
        """Release the mapping but keep its address, so that the allocation may sleep;
        returns this attachment's holder id, for op `sleep`'s `parked`. Works while a
        deferred detach waits for the exports (gpumemctl.tensors). Idempotent."""
        with self._map_lock:
            with self._lock:
                if self._detached:
                    raise UsageError(f"'{self.name}' has been detached")
                if self._parked:
                    return self._holder
                self._parked = True         # no read, write or export from now on
            try:
                self._memory.park()
            except BaseException:
                with self._lock:
                    self._parked = False
                raise
        return self._holder

    def resume(self) -> None:
        """Map the allocation's memory now (op `remap`, after a wake) at the address it had:
        what was made from `ptr` before the sleep sees it again. No-op unless parked."""
        with self._map_lock:
            with self._lock:
                if self._detached or not self._parked:
                    return
            result, fds = self._client.call_fds("remap", handle=self._holder, regions=True,
                                                extents=True)
            info = result["info"]
            expect_fds("remap", info, fds)
            if isinstance(self._memory, CudaMemory):
                self._memory.remap(fds, info)
            else:
                self._memory.remap(fds[0], region_of(info)[0])
            with self._lock:
                self.info, self._parked = info, False

    def seal(self) -> dict:
        """Declare what this writer wrote complete: the allocation is no longer unsealed
        (once ECC exists, parity is brought up to date here)."""
        if not self.writable:
            raise UsageError(f"'{self.name}' is attached read-only: nothing to seal")
        if self._detached:        # a deferred detach still has the memory, and may seal
            raise UsageError(f"'{self.name}' has been detached")
        return self._client.call("seal", path=self.name)

    def detach(self, *, seal: bool = True) -> None:
        """Unmap and release the lock. While DLPack exports are alive this is deferred until
        the last is released; a writer's data is sealed at once all the same (leaving the
        `with` block means "done writing"), unless `seal` is False: then it stays
        `unsealed` until the last export goes (gpumemctl.tensors hands the attachment over
        to its tensors this way)."""
        with self._lock:
            if self._detached or self._pending:
                return
            deferred = self._pending = bool(self._exports)
            if not deferred:
                self._detached = True
        if not deferred:
            self._finish()
        elif self.writable and seal:
            self._client.call("seal", path=self.name)

    def export(self, offset: int, nbytes: int, dtype: tuple[int, int],
               shape: tuple[int, ...]) -> _Export:
        """An object with `__dlpack__` for one typed tensor of `shape` at `offset` (DLPack
        type code and bits in `dtype`), counted like a whole-allocation export."""
        self._check_range(offset, nbytes)
        return _Export(self, offset, dtype, shape)

    def _capsule(self, offset: int, nbytes: int, versioned: bool,
                 dtype: tuple[int, int] = (dlpack.kDLUInt, 8),
                 shape: tuple[int, ...] | None = None):
        with self._lock:
            self._require_attached()
            self._exports += 1
        kind, index = self.__dlpack_device__()
        return dlpack.make_capsule(self.ptr + offset, nbytes, kind, index,
                                   readonly=not self.writable, versioned=versioned,
                                   on_release=self._export_released, dtype=dtype,
                                   shape=shape)

    close = detach

    def _export_released(self) -> None:
        """A DLPack consumer let go (called from its deleter, on any thread, possibly from
        the garbage collector in the middle of other code)."""
        with self._lock:
            self._exports -= 1
            finish = self._pending and self._exports == 0
            if finish:
                self._pending, self._detached = False, True
        if not finish:
            return
        # The collector may run this while this very thread is inside a request on the same
        # connection, or parks or resumes this attachment: finishing here would then
        # deadlock on the client's lock or the mapping's. Finish on the spot only when both
        # are free, else on a helper thread.
        if _free(self._client._lock) and _free(self._map_lock):
            self._finish()
        else:
            threading.Thread(target=self._finish, name="gpumemctl-detach", daemon=True).start()

    def _finish(self) -> None:
        with _registry_lock:
            _registry.discard(self)
        try:
            with self._map_lock:
                self._memory.close()        # parked: only the address range goes
        finally:
            try:
                with contextlib.suppress(NotRunning):   # a dead daemon holds no lock
                    self._client.call("detach", handle=self._holder)
            finally:
                if self._own_client:
                    self._client.close()

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc) -> None:
        self.detach()


def _free(lock) -> bool:
    """Whether nobody, this thread included, holds `lock` now."""
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


class _Export:
    """One typed tensor of an attachment, for a consumer's from_dlpack (Attachment.export)."""

    def __init__(self, owner: Attachment, offset: int, dtype: tuple[int, int],
                 shape: tuple[int, ...]):
        self.owner, self.offset, self.dtype, self.shape = owner, offset, dtype, shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.owner.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gpumemctl attachments export in place; copy=True is not "
                              "supported")
        nbytes = self.dtype[1] // 8
        for d in self.shape:
            nbytes *= d
        versioned = (self.owner.backend != "cuda" and max_version is not None
                     and max_version[0] >= 1)
        return self.owner._capsule(self.offset, nbytes, versioned, self.dtype, self.shape)


class _CallableModule(types.ModuleType):
    """`import gpumemctl.attach` binds this module to the name gpumemctl.attach, shadowing
    the function of the same name: calling the module calls the function."""

    def __call__(self, *args, **kwargs) -> Attachment:
        return attach(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
