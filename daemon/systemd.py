"""The few systemd interfaces gpumemd uses, spoken directly (no libsystemd needed).

- sd_notify: READY=1, STOPPING=1, STATUS=..., and FDSTORE=1 / FDSTOREREMOVE=1 with FDNAME=,
  over the datagram socket named by $NOTIFY_SOCKET (an '@' prefix is an abstract socket).
- $FDSTORE: the unit's FileDescriptorStoreMax=, set by systemd 254 and later when it is
  above 0 (systemd.exec(5)). Past it systemd closes what it is sent and tells the service
  nothing, so gpumemd counts (daemon/keeper/link.py, SystemdFdStore).
- Socket-activation style fd hand-back at start: $LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES,
  fds numbered from 3. systemd passes the fd store's contents this way after a restart.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from gpumemctl.protocol.framing import ancillary

LISTEN_FDS_START = 3


def notify_socket() -> str | None:
    return os.environ.get("NOTIFY_SOCKET") or None


def notify(state: str, fds: Sequence[int] = ()) -> bool:
    """Send one notification; False when not running under systemd."""
    path = notify_socket()
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendmsg([state.encode()], ancillary(list(fds)))
    return True


def fd_store_max() -> int | None:
    """FileDescriptorStoreMax= as systemd told it ($FDSTORE); None where it did not
    (systemd before 254, or a unit without an fd store)."""
    value = os.environ.get("FDSTORE", "")
    return int(value) if value.isdigit() else None


def listen_fds() -> dict[str, list[int]]:
    """fds passed to us at start, grouped by name (several may share a name)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return {}
    count = int(os.environ.get("LISTEN_FDS", "0"))
    names = os.environ.get("LISTEN_FDNAMES", "").split(":") if count else []
    grouped: dict[str, list[int]] = {}
    for i in range(count):
        fd = LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        name = names[i] if i < len(names) else "unknown"
        grouped.setdefault(name, []).append(fd)
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    return grouped


PROCESS_NAME = "gpumemd"      # /proc/PID/comm, what ps -o comm and top show


def name_process(name: str = PROCESS_NAME) -> None:
    """Name this process (prctl PR_SET_NAME): `ps -o comm` and `top` show gpumemd however
    it was started (a console script, `python -c`), and another gpumemd finds it
    (daemon/backends/hostmem.py). Best effort: without libc's prctl nothing changes."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)      # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass
