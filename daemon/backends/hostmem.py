"""How much host memory the host backend offers by default, and who else offers it too
(issue 27: a root gpumemd and a user's each offered half of RAM, so together they promised
all of it, and more with a third, without a word)."""
from __future__ import annotations

import logging
import os

from ..systemd import PROCESS_NAME

log = logging.getLogger("gpumemd")


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory() -> int | None:
    """/proc/meminfo's MemAvailable: what can be had now without swapping."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_capacity(granularity: int) -> int:
    """Half of physical memory, but no more than is available now (what other programs, and
    other gpumemd instances' written memory, already hold), in whole granules."""
    want = physical_memory() // 2
    available = available_memory()
    if available is not None:
        want = min(want, available)
    return max(granularity, want // granularity * granularity)


def other_daemons(me: int | None = None) -> list[tuple[int, int]]:
    """(pid, uid) of the other gpumemd processes on this machine, as /proc shows them (a
    process of another user hidden by hidepid is not seen)."""
    me = os.getpid() if me is None else me
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                name = f.read().strip()
            uid = os.stat(f"/proc/{entry}").st_uid
        except OSError:
            continue
        if name == PROCESS_NAME:          # every gpumemd names itself (systemd.name_process)
            found.append((int(entry), uid))
    return found


def warn_if_shared(capacity: int, explicit: bool) -> None:
    """Say at start that other gpumemd instances offer this machine's memory too."""
    others = other_daemons()
    if not others:
        return
    who = ", ".join(f"pid {pid} (uid {uid})" for pid, uid in others[:5])
    more = f" and {len(others) - 5} more" if len(others) > 5 else ""
    how = "as --host-capacity says" if explicit else \
        "by default half of RAM, at most what is available now"
    log.warning("other gpumemd instances run on this machine (%s%s): each offers host memory "
                "of its own (this one %d MiB, %s), so together they may promise more than "
                "the machine has; give each a share with host_capacity (docs/config.md)",
                who, more, capacity >> 20, how)
