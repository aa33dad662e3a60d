"""NVRTC: runtime compilation of CUDA C++ (cuda.bindings.nvrtc and libnvrtc, loaded lazily)."""
from __future__ import annotations

from .errors import CudaUnavailable, NvrtcError

_nvrtc_module = None


def _nvrtc():
    global _nvrtc_module
    if _nvrtc_module is None:
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:
            raise CudaUnavailable(f"cuda.bindings.nvrtc is not installed ({exc}): pip install "
                                  "'gpumemctl[cuda]'") from None
        except Exception as exc:   # noqa: BLE001 - a broken install: say so, as one error
            raise CudaUnavailable(f"cuda.bindings.nvrtc cannot be loaded: "
                                  f"{type(exc).__name__}: {exc}") from None
        _nvrtc_module = nvrtc
    return _nvrtc_module


def _nv(name: str, *args):
    """Call one NVRTC function and check its nvrtcResult; returns its outputs."""
    fn = getattr(_nvrtc(), name)
    try:
        ret = fn(*args)
    except RuntimeError as exc:   # cuda.pathfinder: libnvrtc.so not found
        raise CudaUnavailable(f"{name}: NVRTC cannot be used: {exc}", call=name) from None
    err, out = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    code = int(err)
    if code:
        label = getattr(err, "name", f"NVRTC_ERROR_{code}")
        raise NvrtcError(f"{name} failed with {label} ({code})", result=code, name=label,
                         call=name)
    if not out:
        return None
    return out[0] if len(out) == 1 else out


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC, e.g. (12, 8)."""
    major, minor = _nv("nvrtcVersion")
    return int(major), int(minor)


def nvrtc_supported_archs() -> list[int]:
    """The sm_XY numbers (e.g. 90) this NVRTC can compile for."""
    return [int(a) for a in _nv("nvrtcGetSupportedArchs")]


def nvrtc_target(cc: int, supported: list[int]) -> tuple[str, bool]:
    """What to compile for a device of compute capability `cc` (90 for 9.0), given the
    architectures NVRTC knows (nvrtc_supported_archs): ('sm_90', True), a cubin for the
    device; or ('compute_NN', False), PTX for the newest one NVRTC knows below it, which the
    driver JIT-compiles. An NvrtcError where NVRTC knows none that old."""
    if cc in supported:
        return f"sm_{cc}", True
    older = [a for a in supported if a <= cc]
    if not older:
        raise NvrtcError(f"NVRTC cannot compile for sm_{cc} (it knows {supported})",
                         call="nvrtcGetSupportedArchs")
    return f"compute_{max(older)}", False


def nvrtc_compile(source: bytes, name: str, options, *, cubin: bool = True) -> tuple[bytes, str]:
    """Compile CUDA C++ `source` with `options` (strings, e.g. '--gpu-architecture=sm_90');
    returns (the cubin, or the PTX without its NUL, and the compiler's log). A compile error
    raises NvrtcError with the log."""
    opts = [o.encode() if isinstance(o, str) else bytes(o) for o in options]
    prog = _nv("nvrtcCreateProgram", bytes(source), name.encode(), 0, [], [])
    try:
        try:
            _nv("nvrtcCompileProgram", prog, len(opts), opts)
            failed = None
        except NvrtcError as exc:
            failed = exc
        size = int(_nv("nvrtcGetProgramLogSize", prog))
        raw = b" " * size
        if size:
            _nv("nvrtcGetProgramLog", prog, raw)
        log = raw.rstrip(b"\0").decode(errors="replace").strip()
        if failed is not None:
            raise NvrtcError(f"compiling {name} failed ({failed.name}):\n{log}",
                             result=failed.result, name=failed.name, call="nvrtcCompileProgram",
                             log=log)
        kind = "CUBIN" if cubin else "PTX"
        size = int(_nv(f"nvrtcGet{kind}Size", prog))
        image = b" " * size
        _nv(f"nvrtcGet{kind}", prog, image)
        return (image if cubin else image.rstrip(b"\0")), log
    finally:
        _nv("nvrtcDestroyProgram", prog)
