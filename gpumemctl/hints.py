"""What a client says when it cannot reach gpumemd: why, and the next command to run
(issue 27: "gpumemd is not running" named no way to start it). Imported only on that error
path: `gpumemctl ls` pays nothing for it."""
from __future__ import annotations

import errno
import os
import stat

from .protocol import NotRunning
from .protocol.defaults import SOCKET_ENV

SYSTEM_SOCKET = "/run/gpumemd/gpumemd.sock"


def not_running(path: str, err: int | None, strerror: str | None) -> NotRunning:
    """The error for a connect() to `path` that failed with `err`."""
    kind = _kind(path)
    if kind not in (None, "socket"):
        return NotRunning(f"cannot connect to {path}: it is {kind}, not a socket; --socket "
                          f"(or ${SOCKET_ENV}) must name the socket gpumemd serves")
    if err == errno.EACCES:
        return NotRunning(f"cannot connect to {path}: permission denied (uid {os.geteuid()}); "
                          "the socket's owner or group decides who may connect: ask the "
                          "administrator of that gpumemd, or start your own (gpumemd "
                          "--socket PATH)")
    why = {errno.ENOENT: f"no socket at {path}",
           errno.ECONNREFUSED: f"{path} is left from an earlier run (connection refused)"}
    reason = why.get(err or 0, f"cannot connect to {path} ({strerror})")
    return NotRunning(f"gpumemd is not running: {reason}; {start_hint(path)}")


def _kind(path: str) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return "socket"
    return {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory",
            stat.S_IFIFO: "a FIFO"}.get(stat.S_IFMT(mode), "not a socket")


def start_hint(path: str) -> str:
    """How to get a gpumemd serving `path` (or to reach one that serves elsewhere)."""
    if path != SYSTEM_SOCKET and _kind(SYSTEM_SOCKET) == "socket":
        return (f"a gpumemd serves {SYSTEM_SOCKET}: use --socket {SYSTEM_SOCKET} or export "
                f"{SOCKET_ENV}={SYSTEM_SOCKET}")
    if os.geteuid() == 0:
        return ("start it: systemctl start gpumemd (once installed: make install), or "
                "make run in a checkout; gpumemctl doctor checks what it needs")
    return (f"start your own: gpumemd --socket {path} (or make run in a checkout), or point "
            f"--socket / ${SOCKET_ENV} at the one that serves; gpumemctl doctor checks what "
            "it needs")
