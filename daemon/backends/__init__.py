"""Memory backends: `cuda` (VMM allocations on GPUs) and `host` (memfd)."""
from __future__ import annotations

from .base import Backend, BackendUnavailable, Buffer, DeviceInfo


def choose_backend(name: str, *, limit: int | None = None) -> tuple[Backend, str]:
    """Start a backend; returns it with the reason it was chosen, for the start-up log.

    `auto` is cuda where a device supports VMM with POSIX-fd handles, host otherwise. `cuda`
    raises BackendUnavailable (one line saying why) where no device can serve. The cuda
    module, and with it CUDA, is imported only when cuda is asked for or tried."""
    if name == "host":
        from .host import HostBackend
        return HostBackend(limit=limit), "requested with --backend host"
    if name not in ("auto", "cuda"):
        raise ValueError(f"unknown backend {name!r}: expected auto, cuda or host")
    from .cuda import CudaBackend
    try:
        backend = CudaBackend()
    except Exception as exc:   # auto must start; cuda says what went wrong
        if name == "cuda":
            raise
        reason = str(exc) if isinstance(exc, BackendUnavailable) else \
            f"the cuda backend failed to start ({type(exc).__name__}: {exc})"
        from .host import HostBackend
        return HostBackend(limit=limit), f"auto: {reason}"
    how = "requested with --backend cuda" if name == "cuda" else "auto"
    return backend, f"{how}: {backend.summary()}"


def open_backend(name: str, **options) -> Backend:
    """Pick and start a backend (see choose_backend)."""
    return choose_backend(name, **options)[0]


__all__ = ["Backend", "BackendUnavailable", "Buffer", "DeviceInfo", "choose_backend",
           "open_backend"]
