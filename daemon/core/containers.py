"""Which container a client runs in: its cgroup, read once from /proc/PID/cgroup.

A shared GPU server runs its engines in containers, where `pid 48121` tells an operator
nothing. When a session is opened (a socket client's hello) or a holder is made for a pid
other than its session's (a file opened on the mount), the daemon reads that process's
/proc/PID/cgroup and derives the container from the path: docker (`/docker/<id>`,
`docker-<id>.scope`), containerd (`cri-containerd-<id>.scope`, `/containerd/<id>`), CRI-O
(`crio-<id>.scope`), podman (`libpod-<id>.scope`) and a Kubernetes pod's UID
(`kubepods-<class>-pod<uid>.slice`, `/kubepods/<class>/pod<uid>/<id>`). It is recorded then
and never read again by pid: the pid may belong to another process later.

The file is the client's to shape: anyone with a delegated cgroup subtree (systemd's user
slices, rootless containers) names cgroups as they like, with any character but `/`, NUL
and newline. So `parse` reads at most MAX_BYTES, cuts the path it keeps to PATH_LIMIT
characters, accepts an id only of the characters an id may hold (so an id is always plain
ASCII, safe in a metric label), and never raises; the path itself is shown escaped in
human output (gpumemctl/protocol/escape.py) like a name. The daemon opens only
/proc/<the peer's SO_PEERCRED pid>/cgroup: nothing a client sends names the file.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import signal

MAX_BYTES = 16384          # of /proc/PID/cgroup read (a v1 hybrid has a dozen lines)
PATH_LIMIT = 1024          # characters of the cgroup path kept; longer ones end in CUT
CUT = "..."
_HEX64 = r"[0-9a-f]{64}"
# A pod's UID: a UUID (its dashes are underscores in systemd unit names), or a static pod's
# 32-hex hash.
_POD = re.compile(r"(?:[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_]"
                  r"[0-9a-f]{12}|[0-9a-f]{32})")
# One path component -> (runtime, id group). The conmon monitors of CRI-O and podman
# (`crio-conmon-<id>.scope`, `libpod-conmon-<id>.scope`) are not the container: no match.
_SCOPES = (
    ("docker", re.compile(rf"docker-({_HEX64})\.scope")),
    ("containerd", re.compile(rf"cri-containerd-({_HEX64})\.scope")),
    ("cri-o", re.compile(rf"crio-({_HEX64})(?:\.scope)?")),
    ("podman", re.compile(rf"libpod-({_HEX64})(?:\.scope)?")),
)
_BARE_ID = re.compile(_HEX64)
# `/docker/<id>`, `/containerd/<id>` (the cgroupfs drivers): the parent's name is the runtime.
_PARENTS = {"docker": "docker", "containerd": "containerd"}
_CONTAINERD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,75}")
_POD_SLICE = re.compile(rf"kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod({_POD.pattern})"
                        r"\.slice")
_POD_DIR = re.compile(rf"pod({_POD.pattern})")


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a holder's process ran when it was recorded: its cgroup path (None: unknown,
    the process had gone or /proc could not say) and its container (None: none found)."""
    cgroup: str | None = None
    container: dict | None = None      # {runtime, id, pod}; id or pod may be None

    @property
    def container_id(self) -> str | None:
        return self.container["id"] if self.container else None

    def detail(self) -> dict:
        """What an event about a holder of this origin adds to its detail: {container: id}
        where there is one (daemon/core/events.py), else nothing."""
        cid = self.container_id
        return {"container": cid} if cid else {}

    def key(self) -> tuple[str, str, str] | None:
        """(runtime, id, pod) with "" for what is unknown: a metric's labels."""
        c = self.container
        if c is None:
            return None
        return (c.get("runtime") or "", c.get("id") or "", c.get("pod") or "")


UNKNOWN = Origin()


def parse(text: str) -> Origin:
    """The cgroup and container that a /proc/PID/cgroup's text names; never raises.
    v2 (`0::/path`) first, then v1 (`N:controllers:/path`, name=systemd before the
    others): the first path that names a container wins, else the first path."""
    if not isinstance(text, str):
        return UNKNOWN
    v2: list[str] = []
    systemd: list[str] = []
    other: list[str] = []
    for line in text[:MAX_BYTES].split("\n"):
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2.append(path)
        elif controllers == "name=systemd":
            systemd.append(path)
        else:
            other.append(path)
    paths = v2 + systemd + other
    if not paths:
        return UNKNOWN
    for path in paths:
        container = container_of(path)
        if container is not None:
            return Origin(_bounded(path), container)
    return Origin(_bounded(paths[0]), None)


def container_of(path: str) -> dict | None:
    """{runtime, id, pod} of a cgroup path, the innermost container named, or None."""
    runtime = cid = pod = None
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if len(part) > 255:            # no cgroup name is longer: not one we know
            continue
        m = _POD_SLICE.fullmatch(part) or (_POD_DIR.fullmatch(part) if i and _kube(parts[:i])
                                          else None)
        if m:
            pod = m.group(1).replace("_", "-")
            continue
        found = _scope(part)
        if found is None and i:
            parent = parts[i - 1]
            if parent in _PARENTS and (_CONTAINERD_ID.fullmatch(part) if parent ==
                                       "containerd" else _BARE_ID.fullmatch(part)):
                found = (_PARENTS[parent], part)
            elif pod is not None and _BARE_ID.fullmatch(part):
                found = ("cri", part)  # cgroupfs kubepods: the runtime is not in the path
        if found is not None:
            runtime, cid = found
    if cid is None and pod is None:
        return None
    if cid is None:
        runtime = "kubernetes"     # a pod's own cgroup (its sandbox): no container in it
    return {"runtime": runtime, "id": cid, "pod": pod}


def _scope(part: str) -> tuple[str, str] | None:
    for runtime, pattern in _SCOPES:
        m = pattern.fullmatch(part)
        if m:
            return runtime, m.group(1)
    return None


def _kube(above: list[str]) -> bool:
    return any(p == "kubepods" or p.startswith("kubepods.") or p.startswith("kubepods-")
               for p in above)


def _bounded(path: str) -> str:
    return path if len(path) <= PATH_LIMIT else path[:PATH_LIMIT - len(CUT)] + CUT


def read(pid: int, pidfd: int | None = None, *, proc: str = "/proc") -> Origin:
    """The Origin of process `pid`, read now, or UNKNOWN. `pidfd`: the peer's, taken at
    connect (SO_PEERPIDFD): the answer is kept only if that process still lives after the
    read, so a pid reused meanwhile lends nothing."""
    if pid <= 0:
        return UNKNOWN
    try:
        fd = os.open(f"{proc}/{int(pid)}/cgroup", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return UNKNOWN
    try:
        raw = os.read(fd, MAX_BYTES)
    except OSError:
        return UNKNOWN
    finally:
        os.close(fd)
    if pidfd is not None and not _alive(pidfd):
        return UNKNOWN
    if len(raw) == MAX_BYTES:              # cut: the last line may be partial
        raw = raw[:raw.rfind(b"\n") + 1]
    return parse(raw.decode("utf-8", "surrogateescape"))


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except PermissionError:
        return True                         # it lives, and is not ours to signal
    except OSError as exc:
        return exc.errno not in (errno.ESRCH,)
    return True
