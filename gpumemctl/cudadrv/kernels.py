"""Device scratch memory, modules and kernel launches (the ECC codec, daemon/ecc/gpu.py)."""
from __future__ import annotations

import ctypes

from .driver import _cu, _driver, attribute


def compute_capability(index: int) -> tuple[int, int]:
    """(major, minor), e.g. (9, 0) on an H100."""
    a = "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_"
    return attribute(index, a + "MAJOR"), attribute(index, a + "MINOR")


def mem_alloc(size: int) -> int:
    """cuMemAlloc in the current context (small scratch buffers, not VMM allocations)."""
    return int(_cu("cuMemAlloc", size))


def mem_free(ptr: int) -> None:
    _cu("cuMemFree", ptr)


def module_load_data(image: bytes):
    """Load a cubin (or NUL-terminated PTX, JIT-compiled by the driver) into the current
    context; returns the CUmodule."""
    buf = ctypes.create_string_buffer(bytes(image), len(image) + 1)   # + NUL for PTX
    return _cu("cuModuleLoadData", ctypes.addressof(buf))


def module_unload(module) -> None:
    _cu("cuModuleUnload", module)


def module_function(module, name: str):
    """The CUfunction of an `extern "C"` kernel in a loaded module."""
    return _cu("cuModuleGetFunction", module, name.encode())


def function_max_dynamic_shared(func, nbytes: int) -> None:
    """Allow a kernel more than 48 KiB of dynamic shared memory per block."""
    attr = _driver().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _cu("cuFuncSetAttribute", func, attr, int(nbytes))


def launch_kernel(func, grid: int | tuple, block: int | tuple, args, stream,
                  shared: int = 0) -> None:
    """cuLaunchKernel: `args` are ctypes scalars (c_uint64 for pointers and sizes, c_uint32,
    ...) in the kernel's parameter order. The driver copies them at the call, so they need
    not outlive it."""
    gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
    bx, by, bz = (block, 1, 1) if isinstance(block, int) else tuple(block)
    args = list(args)
    params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
    _cu("cuLaunchKernel", func, gx, gy, gz, bx, by, bz, shared, stream,
        ctypes.addressof(params), 0)
