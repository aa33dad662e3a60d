"""The FUSE connection's init flags (issue 29; docs/mount.md, "Init flags").

pyfuse3 answers libfuse's init in its own C code, so the capabilities it does not ask for
stay libfuse's defaults: `auto_inval_data` (the kernel drops a file's cached pages whenever
its modification time moves) among them. daemon/fs/_fuseinit.c is a small library over
libfuse's low-level API that interposes `fuse_session_new` and wraps the init callback; this
module loads it before pyfuse3 is loaded (daemon/fs/__init__.py does so first), tells it what
to ask for, and reads back what the kernel offered and what was asked.

Where the library is missing (an install without a compiler or libfuse3-dev: it is an
optional extension) or pyfuse3 was loaded before it, nothing changes and `negotiated()`
says so. It is built with the package (pyproject.toml, `ext-modules`), next to this file:
never from a path anyone else can write.
"""
from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable

# libfuse 3.14's FUSE_CAP_* bits (fuse_common.h) that the daemon may set or clear.
FLAGS = {
    "async_read": 1 << 0, "posix_locks": 1 << 1, "atomic_o_trunc": 1 << 3,
    "export_support": 1 << 4, "dont_mask": 1 << 6, "splice_write": 1 << 7,
    "splice_move": 1 << 8, "splice_read": 1 << 9, "flock_locks": 1 << 10,
    "ioctl_dir": 1 << 11, "auto_inval_data": 1 << 12, "readdirplus": 1 << 13,
    "readdirplus_auto": 1 << 14, "async_dio": 1 << 15, "writeback_cache": 1 << 16,
    "no_open_support": 1 << 17, "parallel_dirops": 1 << 18, "posix_acl": 1 << 19,
    "handle_killpriv": 1 << 20, "cache_symlinks": 1 << 23, "no_opendir_support": 1 << 24,
    "explicit_inval_data": 1 << 25, "expire_only": 1 << 26,
}

_lib: ctypes.CDLL | None = None
_pylib: ctypes.PyDLL | None = None     # the same library, called with the GIL held
_why = "not loaded"


def load() -> None:
    """Load the library (once) with its symbols global, so that pyfuse3, loaded after it,
    binds fuse_session_new to it. A failure is remembered for negotiated()."""
    global _lib, _pylib, _why
    if _lib is not None:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_fuseinit*.so")))
    if not found:
        _why = ("the init-flags library was not built (an install without a C compiler or "
                "libfuse3-dev): the mount keeps libfuse's defaults")
        return
    try:
        lib = ctypes.CDLL(found[0], mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as exc:
        _why = f"the init-flags library {found[0]} does not load: {exc}"
        return
    for name in ("gpumem_fuse_capable", "gpumem_fuse_wanted"):
        getattr(lib, name).restype = ctypes.c_uint
    lib.gpumem_fuse_answered.restype = ctypes.c_ulong
    lib.gpumem_fuse_served.restype = ctypes.c_ulong
    lib.gpumem_fuse_want.argtypes = [ctypes.c_uint, ctypes.c_uint]
    pylib = ctypes.PyDLL(found[0], mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    pylib.gpumem_fuse_serve_writes.argtypes = [ctypes.py_object]
    pylib.gpumem_fuse_serve_writes.restype = None
    lib.gpumem_fuse_receive_buffer.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    lib.gpumem_fuse_receive_buffer.restype = ctypes.c_void_p
    _lib, _pylib, _why = lib, pylib, ""


def want(set_: list[str], clear: list[str]) -> str | None:
    """Ask for the flags in `set_` (where the kernel offers them) and clear those in
    `clear`, at the next mount's init. Returns why it cannot, or None."""
    unknown = [f for f in (*set_, *clear) if f not in FLAGS]
    if unknown:
        raise ValueError(f"unknown FUSE init flag(s) {', '.join(unknown)}: expected "
                         f"{', '.join(FLAGS)}")
    if _lib is None:
        return _why
    _lib.gpumem_fuse_want(_mask(set_), _mask(clear))
    return None


def negotiated() -> dict:
    """After the mount's init: {"capable": [...], "want": [...]} by name, or {"unavailable":
    why}: the library is missing, pyfuse3 did not bind to it, or no init came yet."""
    if _lib is None:
        return {"unavailable": _why}
    if not _lib.gpumem_fuse_sessions():
        return {"unavailable": "pyfuse3 was loaded before the init-flags library: its "
                               "session did not go through it"}
    if not _lib.gpumem_fuse_inits():
        return {"unavailable": "the kernel's init has not come yet"}
    return {"capable": _names(_lib.gpumem_fuse_capable()),
            "want": _names(_lib.gpumem_fuse_wanted())}


def answered_here() -> int | None:
    """How many GETXATTRs of names outside `user.` the library answered itself (ENODATA,
    without a trip through pyfuse3 and the event loop), or None without the library."""
    return _lib.gpumem_fuse_answered() if _lib is not None else None


def serve_writes(writer: Callable[[int, int, memoryview, int], int] | None) -> str | None:
    """Have the library answer WRITE requests by calling `writer(fh, offset, view, address)`
    at once, on the loop's thread, instead of pyfuse3's coroutine over a copy of the bytes
    (daemon/fs/_fuseinit.c): the view (at `address`) is in libfuse's receive buffer, valid
    during the call only; the writer returns the count written or -errno, and never raises.
    None goes back to pyfuse3's path. Returns why it cannot, or None."""
    if _pylib is None:
        return _why
    _pylib.gpumem_fuse_serve_writes(writer)
    return None


def receive_buffer() -> tuple[int, int] | None:
    """(address, size) of the library's own receive buffer, which every request is read into
    from the next mount on (so that it can be page-locked once: Mount.open); None without
    the library, or where it cannot be mapped. The first call makes it."""
    if _lib is None:
        return None
    size = ctypes.c_size_t()
    addr = _lib.gpumem_fuse_receive_buffer(ctypes.byref(size))
    return (addr, size.value) if addr else None


def served_here() -> int | None:
    """How many WRITE requests the library handed the writer (serve_writes), or None
    without the library."""
    return _lib.gpumem_fuse_served() if _lib is not None else None



def _mask(names: list[str]) -> int:
    out = 0
    for name in names:
        out |= FLAGS[name]
    return out


def _names(mask: int) -> list[str]:
    return [name for name, bit in FLAGS.items() if mask & bit]
