"""The mount's life: claim the mount point, mount, serve in the daemon's trio loop, unmount.

A kill -9 of gpumemd leaves its mount behind, answering ENOTCONN ("Transport endpoint is not
connected") to everything. The next start detaches it (fusermount3 -u -z, or umount -l as
root) before mounting again; if that fails it refuses to start and names the command to run.
A mount point that is a live mount of something else is refused: gpumemd never mounts over
another filesystem.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Callable

import pyfuse3
import trio

from gpumemctl.protocol import GpumemError

from .. import paths
from ..core.permissions import DAEMON
from ..verbs import Verbs
from ..verbs.plan import run, run_sync
from . import initflags
from .files import write_only_direct
from .operations import Operations

log = logging.getLogger("gpumemd")
SETTLE_SECONDS = 0.05
# How long the parity of a small file the mount closed may wait to be encoded together with
# its block's neighbours (HandleVerbs.settle_parity; docs/ecc.md).
PARITY_SECONDS = 0.2
# The kernel's readahead for the mount (its backing device's read_ahead_kb). FUSE starts at
# 128 KiB, one request at a time; 4 MiB keeps four 1 MiB read requests in flight, which
# doubled a cold sequential read on the 2-core VM (0.94 -> 1.5 GB/s at bs=128K; 16 MiB was
# slower again). Only root may set it.
READ_AHEAD_KB = 4096
WHAT = "mount point"          # in paths.UnsafePath's line


class MountError(Exception):
    """A reason the mount point cannot be used, in one line with the fix."""


def _mount_table() -> dict[str, str]:
    """mount point -> filesystem type, from /proc/self/mounts."""
    table = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3:
                table[fields[1].replace("\\040", " ")] = fields[2]
    return table


def _detach(path: str) -> None:
    """Lazily unmount a dead mount: fusermount3 works for the user who mounted it, umount
    for root."""
    commands = [["fusermount3", "-u", "-z", path]]
    if os.geteuid() == 0:
        commands.append(["umount", "-l", path])
    for command in commands:
        if shutil.which(command[0]):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode == 0:
                return
            log.debug("%s: %s", " ".join(command), result.stderr.strip())


def check_mount_point(path: str) -> None:
    """Refuse an unsafe mount point before anything is started (claim_mount_point checks
    it again before mounting). A mount there, stale or not, is left to claim_mount_point:
    a dead FUSE mount cannot be looked at."""
    paths.check_parents(WHAT, path)
    if path not in _mount_table():
        paths.check_directory(WHAT, path, missing_ok=True)


def claim_mount_point(path: str) -> None:
    """Make `path` ready to mount on: created if missing, a stale gpumemd mount cleaned.

    The directories above it are checked first (paths.check_parents): root's statvfs,
    umount and mount below follow the name, so nobody else may be able to change it. The
    mount point itself is checked once a stale mount is gone (a dead FUSE mount cannot be
    looked at): not a symlink (the mount would land on its target), ours, and writable by
    nobody else.

    A dead mount is found by statvfs, which the kernel never answers from its cache (a
    stat of the root may be served from cached attributes for a while after the crash)."""
    paths.check_parents(WHAT, path)
    kind = _mount_table().get(path)
    if kind is not None:
        try:
            os.statvfs(path)
        except OSError as exc:
            if exc.errno != errno.ENOTCONN:
                raise MountError(f"mount point {path}: {exc.strerror}") from None
            log.warning("%s is a stale mount (its daemon died); unmounting it", path)
            _detach(path)
            kind = _mount_table().get(path)
            if kind is not None:
                raise MountError(f"{path} is a stale FUSE mount that could not be removed; "
                                 f"run `fusermount3 -u -z {path}` (or `umount -l {path}` "
                                 "as root) and start again") from None
        else:
            raise MountError(f"{path} is already a mount point ({kind}); unmount it or "
                             "choose another --mount")
    paths.safe_directory(WHAT, path, 0o755)


# The connection's init flags (issue 29; docs/mount.md, "Init flags"): libfuse's defaults
# but `auto_inval_data`, which would drop a file's cached pages whenever its modification
# time moves, that is after every write through the mount. The daemon drops them itself when
# another path changes the bytes (daemon/fs/cache.py). For experiments,
# GPUMEMD_FUSE_INIT="+auto_inval_data,-splice_read" sets and clears FUSE_CAP_* flags by name
# (daemon/fs/initflags.py) over these.
DEFAULT_CLEAR = ("auto_inval_data",)
INIT_FLAGS_ENV = "GPUMEMD_FUSE_INIT"


# WRITE requests go to Operations.write_now straight from the init-flags library, without
# pyfuse3's copy of the bytes and its coroutine (docs/mount.md, "Writes from C");
# GPUMEMD_FUSE_WRITES=pyfuse3 sends them through pyfuse3 as before (benchmarks compare both).
WRITES_ENV = "GPUMEMD_FUSE_WRITES"
WRITE_PATHS = ("direct", "pyfuse3")
# The part of the receive buffer page-locked for the cuda backend's DMA: a WRITE (at most
# max_write, 1 MiB with libfuse 3.14) and its headers, with room for a libfuse that reads more.
PINNED_RECEIVE = (4 << 20) + 4096


def write_path() -> str:
    """WRITES_ENV's value, "direct" by default; ValueError names what is allowed."""
    value = os.environ.get(WRITES_ENV, "").strip() or "direct"
    if value not in WRITE_PATHS:
        raise ValueError(f"{WRITES_ENV}: invalid {value!r}: expected one of "
                         f"{', '.join(WRITE_PATHS)}")
    return value


def init_flags_asked() -> tuple[list[str], list[str]]:
    """(set, clear): DEFAULT_CLEAR, then INIT_FLAGS_ENV's changes; ValueError names an
    unknown flag."""
    set_: list[str] = []
    clear: list[str] = list(DEFAULT_CLEAR)
    for item in filter(None, (s.strip() for s in os.environ.get(INIT_FLAGS_ENV, "").split(","))):
        if item[0] not in "+-" or item[1:] not in initflags.FLAGS:
            raise ValueError(f"{INIT_FLAGS_ENV}: invalid {item!r}: expected +NAME or -NAME, "
                             f"NAME one of {', '.join(initflags.FLAGS)}")
        name = item[1:]
        for other in (set_, clear):
            if name in other:
                other.remove(name)
        (set_ if item[0] == "+" else clear).append(name)
    return set_, clear


def _spelled(set_: list[str], clear: list[str]) -> str:
    return ",".join([f"+{f}" for f in set_] + [f"-{f}" for f in clear])


def mount_options() -> set[str]:
    # nodev said outright (libfuse adds it by default today): device nodes on the mount are
    # metadata only, and must never open a device (docs/mount.md, docs/security.md).
    options = {"fsname=gpumemd", "subtype=gpumem", "default_permissions", "nodev"}
    if os.geteuid() == 0:
        # Other users reach their own allocations; default_permissions still applies.
        options.add("allow_other")
    return options


def set_read_ahead(path: str, kib: int) -> None:
    """Set read_ahead_kb of the mount's backing device (/sys/class/bdi/MAJOR:MINOR), found
    in /proc/self/mountinfo; a failure (not root) leaves the kernel's default."""
    try:
        with open("/proc/self/mountinfo") as f:
            devices = [line.split()[2] for line in f
                       if line.split()[4].replace("\\040", " ") == path]
        if not devices:
            return
        with open(f"/sys/class/bdi/{devices[-1]}/read_ahead_kb", "w") as f:
            f.write(str(kib))
    except OSError as exc:
        log.info("readahead of %s left at the kernel's default: %s", path, exc)


class Mount:
    """The filesystem at `path`, served by the verbs; serve() runs in the daemon's nursery."""

    def __init__(self, verbs: Verbs, path: str):
        self.verbs, self.path = verbs, os.path.abspath(path)
        try:
            write_only_direct()
            self.write_path = write_path()
        except ValueError as exc:
            raise MountError(str(exc)) from None
        self.session = verbs.handles.open_session(DAEMON, client="mount")
        self.ops = Operations(verbs, self.session)
        self._unpin: Callable[[], None] = lambda: None

    def open(self) -> None:
        """Claim the mount point and mount (before the event loop starts, so that a failure
        is a plain start-up error)."""
        claim_mount_point(self.path)
        try:
            set_, clear = init_flags_asked()
        except ValueError as exc:
            raise MountError(str(exc)) from None
        why = initflags.want(set_, clear)
        if why and (set_ or clear) and os.environ.get(INIT_FLAGS_ENV):
            log.warning("FUSE init flags %s cannot be asked for: %s", _spelled(set_, clear),
                        why)
        if self.write_path == "direct":
            why = initflags.serve_writes(self.ops.write_now)
            if why:
                log.info("WRITE requests go through pyfuse3: %s", why)
            else:
                self._pin_receive_buffer()
        try:
            pyfuse3.init(self.ops, self.path, mount_options())
        except RuntimeError as exc:
            raise MountError(f"cannot mount {self.path}: {exc}; {why_no_mount()}") from None
        self.verbs.reports.add_watcher(self.ops.kernel)
        self.ops.kernel.mounted = True
        log.info("mounted %s", self.path)

    def _pin_receive_buffer(self) -> None:
        """Where the backend copies by DMA (cuda): have the library receive every request
        into its own buffer (initflags.receive_buffer) and page-lock its head, where a
        WRITE's bytes land, so they go to the device straight from there (docs/mount.md,
        "Writes from C"). Elsewhere libfuse keeps its own buffer: measured on the
        host backend, small writes were about 7% slower with the library's."""
        if not self.verbs.data.pins_sources():
            return
        got = initflags.receive_buffer()
        if got is None:
            return
        addr = got[0]
        try:
            unpin = self.verbs.data.pin_source(addr, PINNED_RECEIVE)
        except Exception as exc:  # noqa: BLE001 - a mount without it is only slower
            log.warning("the mount's receive buffer is not page-locked (%s): writes copy "
                        "through staging", exc)
            return
        if unpin is not None:
            self._unpin = unpin
            self.ops.pinned = (addr, addr + PINNED_RECEIVE)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer the kernel until cancelled (daemon stop), then unmount."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._settle_stragglers)
                nursery.start_soon(_log_init_flags)
                nursery.start_soon(self._tune_readahead)
                nursery.start_soon(self._settle_parity)
                task_status.started()
                await pyfuse3.main()
                nursery.cancel_scope.cancel()
        finally:
            self.close()

    async def _settle_stragglers(self) -> None:
        """Changes no socket request waits for (a crashed client's lease released) reach
        the kernel here."""
        while True:
            await trio.sleep(SETTLE_SECONDS)
            await self.ops.kernel.settle()

    async def _settle_parity(self) -> None:
        """The parity that closes left pending, every PARITY_SECONDS. A pass that fails (a
        full state disk) leaves it pending for the next one; meanwhile verify skips it."""
        while True:
            await trio.sleep(PARITY_SECONDS)
            try:
                await run(self.verbs.handles.settle_parity())
            except GpumemError as exc:
                log.warning("parity of files closed on the mount is still pending: %s", exc)
            except Exception:
                log.exception("the pass over pending parity failed; tried again")

    async def _tune_readahead(self) -> None:
        """Raise the kernel's readahead once it has our INIT reply, which sets it to the
        smaller of its own and ours (so before that it would be set back): a statfs of the
        mount waits for that reply, from a thread while this loop sends it."""
        await trio.to_thread.run_sync(os.statvfs, self.path)
        set_read_ahead(self.path, READ_AHEAD_KB)

    def close(self) -> None:
        if not self.ops.kernel.mounted:
            return
        self.ops.kernel.mounted = False
        self.verbs.reports.remove_watcher(self.ops.kernel)
        pyfuse3.close(unmount=True)
        initflags.serve_writes(None)
        self.ops.pinned = (0, 0)
        try:
            self._unpin()
        except Exception as exc:  # noqa: BLE001 - the process is ending: the pages go with it
            log.warning("the mount's receive buffer stays page-locked: %s", exc)
        try:
            run_sync(self.verbs.handles.end_session(self.session))  # after the loop: in one go
        except GpumemError as exc:        # a full state disk: the stop releases it all
            log.warning("the mount's open files are released later: %s", exc)
        try:        # a clean stop leaves no parity pending: a restart trusts what it finds
            run_sync(self.verbs.handles.settle_parity())
        except GpumemError as exc:        # durable files keep WRITING: rebuilt at the start
            log.warning("parity of files closed on the mount left pending: %s", exc)
        log.info("unmounted %s (the init-flags library answered %s GETXATTRs of names "
                 "outside user.* and passed %s WRITEs to the daemon directly, %d of them "
                 "from its receive buffer, page-locked for the device)", self.path,
                 initflags.answered_here(), initflags.served_here(), self.ops.pinned_writes)


def why_no_mount(device: str = "/dev/fuse") -> str:
    """The likely cause of a failed mount and its fix, found the way `gpumemctl doctor`
    finds it (issue 27: the message asked "is /dev/fuse there?" while doctor knew)."""
    try:
        os.close(os.open(device, os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return (f"{device} is missing: modprobe fuse (in a container: --device "
                    f"{device} --cap-add SYS_ADMIN)")
        return (f"{device} cannot be opened by uid {os.geteuid()} ({exc.strerror}): "
                f"chmod 0666 {device} (its usual mode), or run gpumemd as root")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "fusermount3 is not on PATH: a non-root gpumemd needs it (apt install fuse3)"
    return "gpumemctl doctor checks what a mount needs and says the fix"


async def _log_init_flags() -> None:
    """Once the kernel's init has come (the first requests follow the mount at once): what
    it offered and what the daemon asked for (initflags.negotiated)."""
    await trio.sleep(0.5)
    got = initflags.negotiated()
    if "want" in got:
        log.info("FUSE init: asked for %s (offered %s)", ",".join(got["want"]),
                 ",".join(got["capable"]))
    else:
        log.info("FUSE init flags: %s", got["unavailable"])
