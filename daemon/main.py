"""gpumemd: start-up, the trio main loop, signals and keeper supervision.

Runs in the foreground and logs to stderr (systemd Type=notify: READY=1 once the socket
serves, STOPPING=1 on the way out). SIGTERM/SIGINT stop it cleanly: the socket goes, transient
memory is freed, durable memory stays with the keeper for the next start.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import functools
import logging
import os
import signal
import socket
import sqlite3
import stat
import sys
import time
from collections.abc import Awaitable, Callable

import trio

from gpumemctl.protocol import GpumemError, UsageError, default_socket, default_state_dir

from . import config, paths, systemd
from . import signals as stop_signals
from .backends import BackendUnavailable, choose_backend
from .collector import gc_paused, tune_gc
from .compose import Config, build, start
from .core.fdbudget import FdBudget, raise_open_file_limit
from .core.orphans import ADOPT_FLAG, FREE_FLAG, RECOVERY_DIR, OrphansHeld
from .core.permissions import administrative_uid
from .fs.mount import Mount, MountError, check_mount_point
from .keeper.link import KeeperGone, open_keeper
from .logbudget import ClientLines, summarise_every_minute
from .logs import setup_logging
from .paths import UnsafePath
from .registry import GROUP_COMMIT_SECONDS, Registry, RegistryUnusable
from .server import VERSION, Server
from .server.transport import PRIVILEGED_EXTRA, ConnectionLimits
from .services import autosnap, housekeeping
from .services.health import HealthMonitor
from .services.scrub import Scrubber
from .verbs import Verbs
from .verbs.checks import Checks
from .verbs.service import ServiceVerbs

log = logging.getLogger("gpumemd")


class StartupError(Exception):
    """A reason not to start, shown as one line (exit 1, or 2 for usage)."""


# gpumemd's exit statuses (gpumemd(8), EXIT STATUS; docs/durability.md). Not the CLI's.
EXIT_CANNOT_START = 1     # another daemon, no backend, the mount, the keeper...
EXIT_USAGE = 2            # bad options or configuration file
EXIT_ORPHANS = 3          # the keeper holds memory the registry does not list (OrphansHeld)
EXIT_REGISTRY = 4         # the registry is unreadable, or from a newer gpumemd


def build_parser() -> argparse.ArgumentParser:
    """gpumemd's options; also the source of the OPTIONS section of gpumemd(8)
    (scripts/gen-man.py), so help texts say the rule, not this machine's value. Options
    left out are None: config.apply() fills them from the configuration file, then from
    the built-in defaults (the command line wins over the file)."""
    p = argparse.ArgumentParser(prog="gpumemd", description="Durable GPU memory daemon.")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="configuration file (TOML; default: $GPUMEMD_CONFIG, else "
                        "/etc/gpumemd.toml for root, else $XDG_CONFIG_HOME/gpumemd.toml, "
                        "read if it exists; gpumemd.conf(5))")
    p.add_argument("--backend", choices=("auto", "cuda", "host"), default=None,
                   help="memory backend (auto: cuda where usable, else host; default auto)")
    p.add_argument("--socket", default=None, metavar="PATH",
                   help="Unix socket (default: $GPUMEMD_SOCKET, else /run/gpumemd/gpumemd.sock "
                        "for root, else $XDG_RUNTIME_DIR/gpumemd.sock)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="registry and keeper socket (default: /var/lib/gpumemd for root, "
                        "else $XDG_STATE_HOME/gpumemd)")
    p.add_argument("--mount", default=None, metavar="DIR",
                   help="serve the allocations as a filesystem at DIR (no mount by default)")
    p.add_argument("--enable-fault-injection", action="store_true",
                   help="allow `gpumemctl debug corrupt` (root or this user; tests, drills)")
    p.add_argument("--host-capacity", default=None, metavar="SIZE",
                   help="bytes the host backend may hand out (default: half of RAM)")
    p.add_argument("--slabs", choices=("on", "off"), default=None,
                   help="pack small allocations in slabs (default on; docs/storage.md)")
    p.add_argument("--parity-arenas", choices=("on", "off"), default=None,
                   help="keep ECC parity in shared parity arenas (default on; "
                        "docs/storage.md)")
    p.add_argument("--extents", choices=("on", "off"), default=None,
                   help="resize large GPU memory by extents, without a copy (default on; "
                        "docs/storage.md)")
    p.add_argument("--log-level", default=None,
                   choices=("debug", "info", "warning", "error"),
                   help="least severe to log (default info)")
    # Not configuration keys: each is one decision about one start (docs/durability.md,
    # "Start-up safety"). Without either, that start is refused (exit 3).
    orphans = p.add_mutually_exclusive_group()
    orphans.add_argument(ADOPT_FLAG, dest="orphans", action="store_const", const="adopt",
                         help="when the keeper holds memory that the registry does not list "
                              "(the registry was lost, replaced, or restored from an older "
                              f"backup), re-register it as durable allocations under "
                              f"/{RECOVERY_DIR}/TIME (root's, mode 0700) instead of refusing "
                              "to start; an unreadable registry is first moved aside to "
                              "registry.sqlite.corrupt-TIME")
    orphans.add_argument(FREE_FLAG, dest="orphans", action="store_const", const="free",
                         help=f"as {ADOPT_FLAG}, but free that memory instead: what the "
                              "registry does not list is gone")
    p.add_argument("--version", action="version", version=f"gpumemd {VERSION}")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def lock_state_dir(state_dir: str) -> int:
    """One daemon per state directory: an exclusive flock held for the daemon's life. The
    file stays between runs; it is opened only as a regular file, never through a symlink
    (paths.open_own)."""
    fd = paths.open_own(os.path.join(state_dir, "gpumemd.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupError(f"another gpumemd is running with state directory {state_dir}"
                               ) from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_socket(path: str) -> None:
    """Refuse if a live daemon serves `path`; remove a stale socket file left by a crash,
    and nothing else: a file that is not a socket was not left by gpumemd. Its directory
    was checked first (paths.safe_directory), so what lstat sees stays so."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"refusing the socket {path}: it exists and is not a socket "
                           "(gpumemd removes only a stale socket of its own there)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        log.info("removed the stale socket %s", path)
        return
    finally:
        probe.close()
    raise StartupError(f"another gpumemd is serving {path}")


async def supervise_keeper(service: ServiceVerbs, keeper) -> None:
    """Watch the keeper; if it dies, start a new one and hand it every durable fd again."""
    while True:
        try:
            raw = keeper.watch_socket()
        except (KeeperGone, OSError) as exc:   # died (or its socket went) before we watched
            log.warning("cannot watch the keeper: %s", exc)
        else:
            if raw is None:                  # systemd's fd store needs no watching
                return
            watch = trio.socket.from_stdlib_socket(raw)
            with watch:
                while await watch.recv(4096):
                    pass
        log.warning("the keeper died; starting a new one and re-depositing durable memory")
        await trio.sleep(0.05)
        try:
            keeper.ensure_running()
            count = service.redeposit_all()
            log.info("keeper restarted (pid %s); %d durable allocations re-deposited",
                     keeper.pid, count)
        except (KeeperGone, GpumemError, OSError) as exc:
            log.error("cannot restart the keeper: %s; retrying in 1 s", exc)
            await trio.sleep(1)


def open_file_budget(args) -> FdBudget:
    """Raise the open-file limit to the hard one (every connection and allocation holds
    descriptors; systemd's default soft limit is 1024) and split it (daemon/core/fdbudget.py)."""
    before, limit = raise_open_file_limit()
    fds = FdBudget(limit, args.max_connections, PRIVILEGED_EXTRA, args.max_fd_share_per_uid)
    raised = f" (raised from {before})" if before != limit else ""
    log.info("open-file limit %d%s: %s", limit, raised, fds.summary())
    return fds


STALL_PROBE_SECONDS = 0.5
SWITCH_INTERVAL = 0.0005     # seconds: sys.setswitchinterval (main(), before trio.run)


async def resume_stalled_keeper(service: ServiceVerbs, keeper) -> None:
    """A keeper that stopped answering (SIGSTOP, starved) is probed from a worker thread, so
    the event loop never waits on it; once it answers, what it holds is reconciled with the
    durable allocations and durable changes work again, without a restart."""
    while True:
        await trio.sleep(STALL_PROBE_SECONDS)
        if not keeper.stalled:
            continue
        sock = await trio.to_thread.run_sync(keeper.probe)
        if sock is None:
            continue
        keeper.resume(sock)
        try:
            withdrawn, redeposited = service.reconcile_keeper()
        except (KeeperGone, GpumemError) as exc:
            log.warning("the keeper answers again but reconciling it failed: %s", exc)
            continue
        log.warning("the keeper answers again; %d stale key(s) withdrawn, %d durable "
                    "allocation(s) re-deposited", withdrawn, redeposited)


class GroupCommit:
    """Commits the registry's batch of transient changes GROUP_COMMIT_SECONDS after the
    first of them (Registry.transaction explains group commit).

    Those changes were answered before their commit. When the commit fails (a full state
    disk: SQLite then rolls the batch back), memory stays the truth, as it is for transient
    allocations anyway: once the registry can be written again, its rows are rewritten from
    the tree (check's repairs), so `gpumemctl check` is clean again without a restart."""

    def __init__(self, checks: Checks, registry: Registry):
        self.checks = checks
        self.registry = registry
        self.wake = trio.Event()
        self.stale = False          # a batch was lost: rows must be rewritten from memory
        registry.enable_group_commit(lambda: self.wake.set())

    async def run(self) -> None:
        while True:
            if not self.stale:
                await self.wake.wait()
            self.wake = trio.Event()
            await trio.sleep(GROUP_COMMIT_SECONDS)
            try:
                self.registry.flush()
                if self.registry.batch_lost:        # lost with another change's commit
                    self.registry.batch_lost, self.stale = False, True
                    log.warning("a registry commit failed; the registry is rewritten from "
                                "memory once it can be written")
                if self.stale:
                    self._resync()
            except Exception as exc:  # noqa: BLE001 - retried each second until it works
                self.registry.batch_lost = False
                if not self.stale:
                    log.warning("registry commit failed: %s; the registry is rewritten from "
                                "memory once it can be written", exc)
                self.stale = True
                await trio.sleep(1)

    def _resync(self) -> None:
        report = self.checks.check(repair=True)
        self.stale = False
        log.warning("the registry can be written again; %d difference(s) with memory "
                    "repaired", len(report["problems"]))


BACKGROUND_RETRY_FIRST, BACKGROUND_RETRY_MAX = 1.0, 60.0


async def background(name: str, task: Callable[[], Awaitable[None]]) -> None:
    """A background task that fails is logged and started again after a pause (1 s,
    doubling to a minute): an error in one never stops the daemon, which an exception in a
    nursery's task otherwise would (trio cancels its siblings)."""
    pause = BACKGROUND_RETRY_FIRST
    while True:
        try:
            await task()
            return
        except Exception:
            log.exception("background task %s failed; starting it again in %.0f s", name,
                          pause)
        await trio.sleep(pause)
        pause = min(BACKGROUND_RETRY_MAX, pause * 2)


async def run_daemon(verbs: Verbs, server: Server, mount: Mount | None, *,
                     registry: Registry, keeper, restore_from: str | None = None,
                     snapshot_to: str | None = None, log_lines: ClientLines | None = None
                     ) -> None:
    """Serve until SIGTERM/SIGINT. `restore_from`: restore_on_start's snapshot_dir;
    `snapshot_to`: snapshot_on_stop's (daemon/services/autosnap.py); `log_lines`: the log's
    per-client budget, whose summaries are written once a minute (daemon/logbudget.py)."""
    with stop_signals.receiver() as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(background, "group commit",
                               GroupCommit(verbs.checks, registry).run)
            if server.scrubber is not None:
                nursery.start_soon(background, "scrubber", server.scrubber.run)
            if server.health is not None:
                nursery.start_soon(background, "GPU health", server.health.run)
            await nursery.start(server.serve)
            if mount is not None:
                await nursery.start(mount.serve)
            nursery.start_soon(background, "keeper supervisor",
                               functools.partial(supervise_keeper, verbs.service, keeper))
            nursery.start_soon(background, "keeper stall probe",
                               functools.partial(resume_stalled_keeper, verbs.service,
                                                 keeper))
            nursery.start_soon(background, "registry checkpoint",
                               functools.partial(housekeeping.run, registry,
                                                 verbs.service.sweep_slabs, verbs.compaction))
            if log_lines is not None:
                nursery.start_soon(background, "log summaries",
                                   functools.partial(summarise_every_minute, log_lines))
            systemd.notify(f"READY=1\nSTATUS=serving {server.socket_path}")
            log.info("gpumemd %s serving %s (backend %s, pid %d)", VERSION,
                     server.socket_path, verbs.reports.backend_name, os.getpid())
            if restore_from:
                nursery.start_soon(autosnap.restore_lost, verbs.refill, server.socket_path,
                                   restore_from)
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                systemd.notify("STOPPING=1")
                if snapshot_to:
                    systemd.notify("STATUS=snapshotting before the stop (snapshot_on_stop)")
                    await autosnap.snapshot_before_stop(server.socket_path, snapshot_to,
                                                        signals)
                nursery.cancel_scope.cancel()
                break


def main(argv=None) -> int:
    stop_signals.block()      # before any thread: daemon/signals.py says why
    args = parse_args(argv)
    try:   # before anything is touched: a bad file changes nothing
        config.apply(args, config.load(args.config))
    except GpumemError as exc:
        print(f"gpumemd: {exc}", file=sys.stderr)
        return 2
    lines = setup_logging(args.log_level)
    systemd.name_process()
    try:
        return _main(args, lines)
    except OrphansHeld as exc:
        print(f"gpumemd: {exc}", file=sys.stderr)
        return EXIT_ORPHANS
    except RegistryUnusable as exc:
        print(f"gpumemd: {registry_advice(exc)}", file=sys.stderr)
        return EXIT_REGISTRY
    except (StartupError, UnsafePath, MountError, GpumemError) as exc:
        print(f"gpumemd: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_CANNOT_START


def registry_advice(exc: RegistryUnusable) -> str:
    """The one line for a registry that cannot be used: what is wrong, and what to do."""
    if not exc.corrupt:
        return str(exc)
    return (f"{exc}: move it aside (with its -wal and -shm files) and restore it from a "
            f"backup, or start with {ADOPT_FLAG} to move it aside and re-register what the "
            f"keeper holds under /{RECOVERY_DIR}/")


def open_registry(path: str, orphans: str, max_event_bytes: int | None) -> Registry:
    """Open (or create) the registry. With --adopt-orphans or --free-orphans an unreadable
    one is moved aside and a new one made: the keeper's memory then counts as orphans."""
    bounds = {} if max_event_bytes is None else {"max_event_bytes": max_event_bytes}
    try:
        return Registry(path, **bounds)
    except RegistryUnusable as exc:
        if not exc.corrupt or orphans == "refuse":
            raise
        aside = move_registry_aside(path)
        log.warning("%s; moved it aside to %s and starting with a new registry, as told", exc,
                    aside)
        return Registry(path, **bounds)
    except sqlite3.Error as exc:
        raise StartupError(f"cannot open registry {path}: {exc}") from None


def move_registry_aside(path: str) -> str:
    """Rename the registry and its -wal and -shm files (a WAL must never meet another
    database) to PATH.corrupt-TIME, PATH.corrupt-TIME-wal, ...; returns the new path."""
    aside = f"{path}.corrupt-{time.strftime('%Y-%m-%dT%H-%M-%SZ', time.gmtime())}"
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, aside + suffix)
    return aside


def remove_new_registry(registry: Registry) -> None:
    """A start refused before it served leaves no registry it created itself behind: the
    administrator may still restore the old one in its place."""
    registry.close()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(registry.path + suffix)


def quota_bytes(quota: int | float | None, backend) -> int | None:
    """config default_quota in bytes: a share (a float) is of all devices' memory (what
    the backend may hand out on each: DeviceInfo.total)."""
    if isinstance(quota, float):
        return int(quota * sum(dev.total for dev in backend.devices()))
    return quota


def _main(args, lines: ClientLines | None = None) -> int:
    # Before anything is made in them: root must never act on a name another user controls.
    state_dir = paths.safe_directory("state directory", args.state_dir or default_state_dir(),
                                     0o700)
    socket_path = os.path.abspath(args.socket or default_socket())
    paths.safe_directory("socket directory", os.path.dirname(socket_path))
    mount_path = os.path.abspath(args.mount) if args.mount else None
    if mount_path:
        check_mount_point(mount_path)
    lock_fd = lock_state_dir(state_dir)
    claim_socket(socket_path)
    fds = open_file_budget(args)         # before the keeper starts: it inherits the limit
    try:
        backend, why = choose_backend(args.backend, limit=args.host_capacity)
    except BackendUnavailable as exc:
        raise StartupError(f"--backend {args.backend}: {exc}") from None
    log.info("backend %s chosen (%s)", backend.name, why)
    orphans = args.orphans or "refuse"
    registry = open_registry(os.path.join(state_dir, "registry.sqlite"), orphans,
                             args.event_log_size)
    keeper = open_keeper(state_dir, args.fd_store_max)
    backend.ecc_cache_dir = os.path.join(state_dir, "ecc-cache")   # compiled GPU kernels
    core, verbs = build(registry, backend, keeper, Config(
        fault_injection=args.enable_fault_injection, default_ecc=args.ecc, quotas=args.quotas,
        default_quota=quota_bytes(args.default_quota, backend),
        max_names_per_uid=args.max_names_per_uid,
        max_handles_per_uid=args.max_handles_per_uid,
        fds_to_readers=args.cuda_fds_to_readers, mountpoint=mount_path,
        metadata_max_bytes=args.metadata_max_bytes,
        metadata_user_max_bytes=args.metadata_user_max_bytes, slabs=args.slabs,
        parity_arenas=args.parity_arenas, extents=args.extents,
        compact_min_slack=args.compact_min_slack))
    if args.config_path:
        log.info("configuration read from %s", args.config_path)
    tune_gc()
    try:
        with gc_paused():            # start-up makes a node per row: nothing to collect
            summary = start(verbs, orphans)
    except OrphansHeld:
        keeper.close()
        if registry.created:
            remove_new_registry(registry)
        else:
            registry.close()
        raise
    except sqlite3.Error as exc:      # a full or read-only state disk: a line, not a trace
        raise StartupError(f"cannot start: registry {registry.path}: {exc}") from None
    log.info("registry loaded: %(adopted)d adopted, %(lost)d lost, %(orphans_freed)d orphans "
             "freed, %(orphans_adopted)d orphans re-registered, %(transients_dropped)d stale "
             "transients dropped", summary)
    fds.watch(core.quotas.allocations, core.quotas.kept, lambda: len(core.ns.nodes),
              lambda uid: core.ns.nodes.owned.get(uid, 0), administrative_uid)
    core.custody.fds, fds.slab_fds = fds, core.backend.pool.slab_fds
    fds.own = lambda: (core.backend.own_buffers, core.backend.own_generation,
                      core.backend.own_extra)
    server = Server(verbs, socket_path, {"socket": socket_path, "state_dir": state_dir,
                                           "keeper_kind": keeper.kind, "mount": mount_path},
                    scrubber=Scrubber(verbs, default_rate=args.scrub_rate),
                    limits=ConnectionLimits(fds.connections, args.max_connections_per_uid,
                                            args.max_connection_rate_per_uid),
                    admin_gid=args.admin_group, health=HealthMonitor(verbs))
    mount = Mount(verbs, mount_path) if mount_path else None
    # The event loop shares the GIL with worker threads that encode parity (a plan's
    # ParityWork, daemon/verbs/plan.py): at each system call it gives the GIL up, and
    # CPython makes it wait a whole switch interval to take it back from a busy thread.
    # 5 ms by default, several times per request; 0.5 ms keeps a request's wait small.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        if mount is not None:
            mount.open()
        trio.run(functools.partial(
            run_daemon, verbs, server, mount, registry=registry, keeper=keeper,
            log_lines=lines,
            restore_from=args.snapshot_dir if args.restore_on_start else None,
            snapshot_to=args.snapshot_dir if args.snapshot_on_stop else None))
    finally:
        if mount is not None:
            mount.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        verbs.service.shutdown()
        registry.flush()
        registry.checkpoint("TRUNCATE")
        registry.close()
        backend.close()
        os.close(lock_fd)
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
