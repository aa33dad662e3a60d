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
import logging
import os
import signal
import socket
import sys

import trio

from gpumemctl.protocol import GpumemError, UsageError, default_socket, default_state_dir

from . import config, systemd
from .backends import BackendUnavailable, choose_backend
from .keeper_link import KeeperGone, open_keeper
from .manager import AllocationManager
from .mount import Mount, MountError
from .quotas import Quotas
from .scrub import Scrubber
from .registry import GROUP_COMMIT_SECONDS, Registry
from .server import VERSION, Server

log = logging.getLogger("gpumemd")


class StartupError(Exception):
    """A reason not to start, shown as one line (exit 1, or 2 for usage)."""


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
    p.add_argument("--log-level", default=None,
                   choices=("debug", "info", "warning", "error"),
                   help="least severe to log (default info)")
    p.add_argument("--version", action="version", version=f"gpumemd {VERSION}")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def lock_state_dir(state_dir: str) -> int:
    """One daemon per state directory: an exclusive flock held for the daemon's life."""
    fd = os.open(os.path.join(state_dir, "gpumemd.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupError(f"another gpumemd is running with state directory {state_dir}")
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_socket(path: str) -> None:
    """Refuse if a live daemon serves `path`; remove a stale socket file left by a crash."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    if not os.path.exists(path):
        return
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


async def supervise_keeper(manager: AllocationManager) -> None:
    """Watch the keeper; if it dies, start a new one and hand it every durable fd again."""
    while True:
        try:
            raw = manager.keeper.watch_socket()
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
            manager.keeper.ensure_running()
            count = manager.redeposit_all()
            log.info("keeper restarted (pid %s); %d durable allocations re-deposited",
                     manager.keeper.pid, count)
        except (KeeperGone, GpumemError, OSError) as exc:
            log.error("cannot restart the keeper: %s; retrying in 1 s", exc)
            await trio.sleep(1)


CHECKPOINT_SECONDS = 1.0


async def checkpoint_registry(manager: AllocationManager) -> None:
    """Fold the registry's WAL into its database off the event loop (see Registry)."""
    while True:
        await trio.sleep(CHECKPOINT_SECONDS)
        try:
            await trio.to_thread.run_sync(manager.registry.checkpoint)
        except Exception as exc:  # noqa: BLE001 - retried next time; the WAL stays valid
            log.warning("registry checkpoint failed: %s", exc)


class GroupCommit:
    """Commits the registry's batch of transient changes GROUP_COMMIT_SECONDS after the
    first of them (Registry.transaction explains group commit)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.wake = trio.Event()
        registry.group_commit = True
        registry.on_batch = lambda: self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            await trio.sleep(GROUP_COMMIT_SECONDS)
            try:
                self.registry.flush()
            except Exception as exc:  # noqa: BLE001 - the batch stays open; retried next time
                log.warning("registry commit failed: %s", exc)
                self.wake.set()
                await trio.sleep(1)


async def run_daemon(manager: AllocationManager, server: Server,
                     mount: Mount | None = None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(GroupCommit(manager.registry).run)
            if server.scrubber is not None:
                nursery.start_soon(server.scrubber.run)
            await nursery.start(server.serve)
            if mount is not None:
                await nursery.start(mount.serve)
            nursery.start_soon(supervise_keeper, manager)
            nursery.start_soon(checkpoint_registry, manager)
            systemd.notify(f"READY=1\nSTATUS=serving {server.socket_path}")
            log.info("gpumemd %s serving %s (backend %s, pid %d)", VERSION,
                     server.socket_path, manager.backend.name, os.getpid())
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                systemd.notify("STOPPING=1")
                nursery.cancel_scope.cancel()
                break


def main(argv=None) -> int:
    args = parse_args(argv)
    try:   # before anything is touched: a bad file changes nothing
        config.apply(args, config.load(args.config))
    except GpumemError as exc:
        print(f"gpumemd: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level)
    try:
        return _main(args)
    except (StartupError, MountError, GpumemError) as exc:
        print(f"gpumemd: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


# journald's priorities for Python's levels (sd-daemon(3): "<N>" prefixes on stderr lines).
JOURNAL_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """For stderr connected to journald: no timestamp (the journal adds its own, and a second
    one only clutters `journalctl`), and the level as a "<N>" priority prefix, which journald
    turns into the entry's PRIORITY (so `journalctl -p warning` works)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prio = JOURNAL_PRIORITY.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in text.split("\n"))


def stderr_is_journal() -> bool:
    """$JOURNAL_STREAM is "DEVICE:INODE" of the stream systemd connected; it counts only if
    stderr is still that stream (systemd.exec(5)): a shell redirect inherits the variable."""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def setup_logging(level: str) -> None:
    """One line per record on stderr. With a timestamp on a terminal or in a file; without,
    and with priority prefixes, under journald."""
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        handler.setFormatter(JournalFormatter("%(levelname)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s gpumemd[%(process)d] %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _main(args) -> int:
    state_dir = os.path.abspath(args.state_dir or default_state_dir())
    socket_path = os.path.abspath(args.socket or default_socket())
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    lock_fd = lock_state_dir(state_dir)
    claim_socket(socket_path)
    try:
        backend, why = choose_backend(args.backend, limit=args.host_capacity)
    except BackendUnavailable as exc:
        raise StartupError(f"--backend {args.backend}: {exc}") from None
    log.info("backend %s chosen (%s)", backend.name, why)
    registry = Registry(os.path.join(state_dir, "registry.sqlite"))
    keeper = open_keeper(state_dir)
    backend.ecc_cache_dir = os.path.join(state_dir, "ecc-cache")   # compiled GPU kernels
    manager = AllocationManager(registry, backend, keeper)
    manager.fault_injection = args.enable_fault_injection
    manager.default_ecc = args.ecc
    manager.quotas = Quotas(manager, args.quotas)
    if args.config_path:
        log.info("configuration read from %s", args.config_path)
    summary = manager.start()
    log.info("registry loaded: %(adopted)d adopted, %(lost)d lost, %(orphans_freed)d orphans "
             "freed, %(transients_dropped)d stale transients dropped", summary)
    mount_path = os.path.abspath(args.mount) if args.mount else None
    server = Server(manager, socket_path, {"socket": socket_path, "state_dir": state_dir,
                                           "keeper_kind": keeper.kind, "mount": mount_path})
    server.scrubber = Scrubber(manager, default_rate=args.scrub_rate)
    mount = Mount(manager, mount_path) if mount_path else None
    try:
        if mount is not None:
            mount.open()
        trio.run(run_daemon, manager, server, mount)
    finally:
        if mount is not None:
            mount.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        manager.shutdown()
        registry.flush()
        registry.checkpoint("TRUNCATE")
        registry.close()
        backend.close()
        os.close(lock_fd)
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
