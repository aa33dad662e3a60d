"""DLPack capsules made with ctypes, so attach() needs neither numpy nor torch.

A capsule holds a DLManagedTensor: a 1-D uint8 tensor over memory someone else owns (here, an
attached allocation). The consumer (torch.from_dlpack, cupy.from_dlpack, numpy.from_dlpack)
renames the capsule to "used_dltensor" and later calls the tensor's `deleter`; a capsule never
consumed calls it from its own destructor. The deleter tells the owner that one export fewer
is alive, which is how an Attachment knows when it may really unmap (gpumemctl.attach).

Two layouts (https://dmlc.github.io/dlpack/latest/c_api.html):
- "dltensor": DLManagedTensor, understood by every consumer; it cannot say read-only.
- "dltensor_versioned": DLManagedTensorVersioned (DLPack 1.0) with flags, where
  DLPACK_FLAG_BITMASK_READ_ONLY makes numpy hand out a read-only array.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

kDLCPU = 1
kDLCUDA = 2
kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4
kDLComplex = 5
kDLBool = 6
kDLFloat8 = {"float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9,
             "float8_e4m3fn": 10, "float8_e4m3fnuz": 11, "float8_e5m2": 12,
             "float8_e5m2fnuz": 13, "float8_e8m0fnu": 14}
FLAG_READ_ONLY = 1 << 0


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# Everything a live export needs, keyed by the managed struct's address: the ctypes objects
# must stay alive until the consumer calls the deleter.
_live: dict[int, tuple] = {}
_lock = threading.Lock()


def _release(address: int) -> None:
    with _lock:
        entry = _live.pop(address, None)
    if entry is not None and entry[-1] is not None:
        entry[-1]()


@DELETER
def _deleter(address):
    try:
        _release(address)
    except Exception:   # noqa: BLE001 - a C caller cannot take a Python exception
        pass


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# PyCapsule_New keeps the name pointer: these bytes live as long as the module.
_NAME_LEGACY = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    """A capsule nobody consumed still owns its tensor: release it."""
    try:
        for name in (_NAME_LEGACY, _NAME_VERSIONED):
            if _api.PyCapsule_IsValid(capsule, name):
                _release(_api.PyCapsule_GetPointer(capsule, name))
                return
    except Exception:   # noqa: BLE001 - runs inside a deallocation
        pass


def dtype_code(dtype) -> tuple[int, int]:
    """DLPack's (type code, bits) of a numpy-style dtype (numpy, ml_dtypes, jax.numpy)."""
    kind, bits = dtype.kind, dtype.itemsize * 8
    if dtype.name == "bfloat16":
        return kDLBfloat, bits
    if dtype.name.startswith("float8"):
        return kDLFloat8.get(dtype.name, kDLUInt), bits
    code = {"b": kDLBool, "u": kDLUInt, "i": kDLInt, "f": kDLFloat, "c": kDLComplex}.get(kind)
    if code is None:
        raise ValueError(f"no DLPack type for dtype {dtype}")
    return code, bits


def make_capsule(ptr: int, nbytes: int, device_type: int, device_id: int, *,
                 readonly: bool, versioned: bool,
                 on_release: Callable[[], None] | None = None,
                 dtype: tuple[int, int] = (kDLUInt, 8),
                 shape: tuple[int, ...] | None = None):
    """A capsule for a tensor at `ptr`: by default 1-D uint8 of `nbytes`; else of
    `dtype` (DLPack's type code and bits) and `shape`, C-contiguous. `on_release` runs once
    the consumer (or the unconsumed capsule) lets go of it."""
    dims = (nbytes,) if shape is None else tuple(shape)
    shape_array = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    steps, step = [], 1
    for d in reversed(dims):
        steps.append(step)
        step *= max(d, 1)
    strides = (ctypes.c_int64 * max(len(dims), 1))(*reversed(steps))
    tensor = DLTensor(data=ptr, device=DLDevice(device_type, device_id), ndim=len(dims),
                      dtype=DLDataType(dtype[0], dtype[1], 1),
                      shape=ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64)),
                      strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)),
                      byte_offset=0)
    managed: DLManagedTensorVersioned | DLManagedTensor
    if versioned:
        managed = DLManagedTensorVersioned(version=DLPackVersion(1, 0), manager_ctx=None,
                                           deleter=_deleter,
                                           flags=FLAG_READ_ONLY if readonly else 0,
                                           dl_tensor=tensor)
    else:
        managed = DLManagedTensor(dl_tensor=tensor, manager_ctx=None, deleter=_deleter)
    address = ctypes.addressof(managed)
    with _lock:
        _live[address] = (managed, shape_array, strides, on_release)
    name = _NAME_VERSIONED if versioned else _NAME_LEGACY
    return _api.PyCapsule_New(address, name, ctypes.cast(_capsule_destructor, ctypes.c_void_p))


def live_exports() -> int:
    """Exports not yet released (for tests)."""
    with _lock:
        return len(_live)
