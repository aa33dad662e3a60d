"""gpumemctl: durable GPU memory, from the shell and from Python.

`Client` talks to gpumemd over its Unix socket; `attach(name, mode)` maps an allocation into
this process for PyTorch, CuPy or numpy (DLPack); `sleep(names)` and `wake(names)` move
allocations to host memory and back, this process's attachments kept at their addresses.
Imports stay lazy so that `gpumemctl ls` starts fast and `import gpumemctl.protocol` (used by
the daemon) pulls in nothing else.
"""
from __future__ import annotations

# The distribution's one version, written in gpumemctl/protocol/release.py, where the daemon
# may read it too.
from .protocol.release import VERSION as __version__

__all__ = ["Attachment", "Client", "Handle", "__version__", "attach", "sleep", "wake"]


def __getattr__(name: str):
    if name == "Client":
        from .client import Client
        return Client
    if name == "Handle":
        from .handle import Handle
        return Handle
    if name in ("attach", "Attachment"):
        # The submodule gpumemctl.attach and the function attach() share a name: the module
        # is callable (it calls the function), so whichever binding wins, both uses work.
        import importlib
        module = importlib.import_module(__name__ + ".attach")
        return module if name == "attach" else module.Attachment
    if name in ("sleep", "wake"):      # Client.sleep/wake on a connection of their own
        from .sleepwake import sleep_names, wake_names
        return sleep_names if name == "sleep" else wake_names
    raise AttributeError(f"module 'gpumemctl' has no attribute {name!r}")
