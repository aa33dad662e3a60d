"""What every request of the mount goes through, whatever it asks: the caller's
credentials, from the FUSE request context; names, decoded as the socket API spells them;
and the error boundary (`handler`), which turns protocol errors into `FUSEError(errno)`
(daemon/fs/errno_map.py), answers an unexpected exception EIO with its traceback logged (a
bug fails one request and never the mount), counts what a request logs against its uid, and
marks a request as the mount's own (KernelCache.own_request), so that the watchers leave
what the kernel caches of its own doing alone.
"""
from __future__ import annotations

import errno
import functools
import inspect
import logging

import pyfuse3

from gpumemctl.protocol import GpumemError, name_from_bytes

from ..core.permissions import Credentials, supplementary_groups
from ..logbudget import CLIENT_UID
from .cache import KernelCache
from .errno_map import errno_for

log = logging.getLogger("gpumemd.fs")


class ProcGroups:
    """A process's supplementary groups, read from /proc only if a check needs them (most
    requests are decided by uid alone: root, or the owner).

    /proc and not SO_PEERGROUPS as the socket does (daemon/core/permissions.py): a FUSE request
    carries the caller's pid, uid and gid and nothing else, and there is no socket of the
    caller's to ask. So this is what the kernel offers. It is read while the request is
    being served, while the caller normally still waits in its system call (a caller killed
    meanwhile could leave its pid to another process: a narrow window, and the kernel has
    checked the permission bits already wherever default_permissions applies)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._groups: frozenset[int] | None = None

    def __contains__(self, gid: object) -> bool:
        if self._groups is None:
            self._groups = supplementary_groups(self.pid)
        return gid in self._groups


def credentials(ctx) -> Credentials:
    return Credentials(pid=ctx.pid, uid=ctx.uid, gid=ctx.gid, groups=ProcGroups(ctx.pid))


def decode_name(raw: bytes) -> str:
    """A name from the kernel, spelled as the socket API spells it: any bytes but NUL and
    `/` (the kernel lets neither through), so one that is not UTF-8 too, with
    surrogateescape (gpumemctl/protocol/names.py)."""
    return name_from_bytes(raw)


def handler(method):
    """The error boundary of every operation (see the module docstring), a method of
    Operations, whose `kernel` is its KernelCache. A plain method is also marked as the
    mount's own request, so the watchers do not invalidate what the kernel knows; an async
    one (a plan's: fsync, release) marks each of its steps on the loop itself
    (Operations._run, OwnSteps), never the time it waits. The lines a request logs are its
    uid's (daemon/logbudget.py): FUSE passes the request context last. read, write and the
    handle ops take none: what they log is not counted against anyone (their refusals log
    nothing; a bug's traceback does)."""
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def run_async(self, *args):
            client = CLIENT_UID.set(getattr(args[-1], "uid", None) if args else None)
            try:
                return await method(self, *args)
            except Exception as exc:  # noqa: BLE001 - fuse_error logs a bug's traceback
                raise fuse_error(method.__name__, args, exc) from None
            finally:
                CLIENT_UID.reset(client)
        return run_async

    @functools.wraps(method)        # wrapper.__wrapped__ is `method` (answer_now's)
    async def wrapper(self, *args):
        return answer_now(self, method, args)
    return wrapper


def answer_now(ops, method, args: tuple):
    """A plain handler inside the boundary, called at once: through pyfuse3 (handler), or
    from the init-flags library's WRITE path (Operations.write_now), which has no coroutine
    and no turn of the event loop between the request and its answer."""
    ops.kernel.own_request = True
    client = CLIENT_UID.set(getattr(args[-1], "uid", None) if args else None)
    try:
        return method(ops, *args)
    except Exception as exc:  # noqa: BLE001 - fuse_error logs a bug's traceback
        raise fuse_error(method.__name__, args, exc) from None
    finally:
        CLIENT_UID.reset(client)
        ops.kernel.own_request = False


class OwnSteps:
    """Entered around each step on the loop of a plan the mount runs: while inside, a change
    is the mount's own (KernelCache.own_request), as during a plain operation."""

    def __init__(self, kernel: KernelCache):
        self.kernel = kernel

    def __enter__(self) -> None:
        self.kernel.own_request = True

    def __exit__(self, *exc) -> None:
        self.kernel.own_request = False


def fuse_error(name: str, args: tuple, exc: Exception) -> pyfuse3.FUSEError:
    """What the kernel is answered (called while `exc` is being handled)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, GpumemError):
        log.debug("%s%r: %s", name, args[:2], exc)
        return pyfuse3.FUSEError(errno_for(exc))
    log.exception("%s%r failed", name, args[:2])
    return pyfuse3.FUSEError(errno.EIO)
