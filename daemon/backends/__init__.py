"""Memory backends: `cuda` (VMM allocations on GPUs) and `host` (memfd)."""
from __future__ import annotations

from .base import Backend, Buffer, DeviceInfo


def open_backend(name: str, **options) -> Backend:
    """Pick and start a backend. `auto` is cuda where a device supports VMM with POSIX-fd
    handles, host otherwise (the cuda backend arrives with its own issue)."""
    if name in ("auto", "host"):
        from .host import HostBackend
        return HostBackend(**options)
    raise ValueError(f"unknown backend {name!r}: expected auto, cuda or host")


__all__ = ["Backend", "Buffer", "DeviceInfo", "open_backend"]
