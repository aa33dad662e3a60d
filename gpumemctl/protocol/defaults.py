"""Default paths shared by the daemon and the client (docs/design.md, "Defaults")."""
from __future__ import annotations

import os

PROTOCOL_VERSION = 1
SOCKET_ENV = "GPUMEMD_SOCKET"


def default_socket() -> str:
    if os.environ.get(SOCKET_ENV):
        return os.environ[SOCKET_ENV]
    if os.geteuid() == 0:
        return "/run/gpumemd/gpumemd.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return os.path.join(runtime, "gpumemd.sock")


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/gpumemd"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "gpumemd")
