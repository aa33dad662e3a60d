"""The typed exceptions of gpumemctl.cudadrv: one class per CUresult.

`CudaError` carries `.result` (the CUresult as int) and `.name` ('CUDA_ERROR_...'); there is one
subclass per CUresult, made on demand by `error_class(name)`, and the ones code catches are
named here (CudaOutOfMemory, CudaNotSupported, ...). `CudaUnavailable` means cuda-python or the
driver library (libcuda.so.1) could not be loaded at all; `NvrtcError` is a failed NVRTC call.
"""
from __future__ import annotations

import re
import threading


class CudaError(Exception):
    """A failed CUDA driver call. `.result` is the CUresult (int), `.name` its name."""

    result = -1
    name = "CUDA_ERROR"

    def __init__(self, message: str, *, result: int | None = None, name: str | None = None,
                 call: str | None = None):
        super().__init__(message)
        if result is not None:
            self.result = result
        if name is not None:
            self.name = name
        self.call = call


class CudaUnavailable(CudaError):
    """cuda-python is not installed, or the NVIDIA driver library cannot be loaded."""

    name = "CUDA_UNAVAILABLE"


_CLASSES: dict[str, type[CudaError]] = {}
_CLASSES_LOCK = threading.Lock()


def _named(name: str, result: int):
    """Register an explicitly written subclass for one CUresult."""
    def register(cls):
        cls.name, cls.result = name, result
        _CLASSES[name] = cls
        return cls
    return register


@_named("CUDA_ERROR_INVALID_VALUE", 1)
class CudaInvalidValue(CudaError):
    pass


@_named("CUDA_ERROR_OUT_OF_MEMORY", 2)
class CudaOutOfMemory(CudaError):
    pass


@_named("CUDA_ERROR_NOT_INITIALIZED", 3)
class CudaNotInitialized(CudaError):
    pass


@_named("CUDA_ERROR_NO_DEVICE", 100)
class CudaNoDevice(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_DEVICE", 101)
class CudaInvalidDevice(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_CONTEXT", 201)
class CudaInvalidContext(CudaError):
    pass


@_named("CUDA_ERROR_INVALID_HANDLE", 400)
class CudaInvalidHandle(CudaError):
    pass


@_named("CUDA_ERROR_NOT_FOUND", 500)
class CudaNotFound(CudaError):
    pass


@_named("CUDA_ERROR_ILLEGAL_ADDRESS", 700)
class CudaIllegalAddress(CudaError):
    pass


@_named("CUDA_ERROR_NOT_PERMITTED", 800)
class CudaNotPermitted(CudaError):
    pass


@_named("CUDA_ERROR_NOT_SUPPORTED", 801)
class CudaNotSupported(CudaError):
    pass


def _class_name(name: str) -> str:
    """'CUDA_ERROR_LAUNCH_FAILED' -> 'CudaLaunchFailed'."""
    words = re.sub(r"^CUDA_ERROR_", "", name).split("_")
    return "Cuda" + "".join(w.capitalize() for w in words if w)


def error_class(name: str) -> type[CudaError]:
    """The exception class for a CUresult name, made on first use and cached."""
    with _CLASSES_LOCK:
        cls = _CLASSES.get(name)
        if cls is None:
            cls = type(_class_name(name), (CudaError,), {"name": name, "__module__": __name__})
            _CLASSES[name] = cls
        return cls


class NvrtcError(CudaError):
    """A failed NVRTC call; a failed compilation carries the compiler's `.log`."""

    name = "NVRTC_ERROR"

    def __init__(self, message: str, *, log: str = "", **kw):
        super().__init__(message, **kw)
        self.log = log

