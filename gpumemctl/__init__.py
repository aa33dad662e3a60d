"""gpumemctl: durable GPU memory, from the shell and from Python.

`Client` talks to gpumemd over its Unix socket. Imports stay lazy so that `gpumemctl ls`
starts fast and `import gpumemctl.protocol` (used by the daemon) pulls in nothing else.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Client", "Handle", "__version__"]


def __getattr__(name: str):
    if name in ("Client", "Handle"):
        from . import client
        return getattr(client, name)
    raise AttributeError(f"module 'gpumemctl' has no attribute {name!r}")
