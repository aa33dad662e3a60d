"""The keeper: a tiny process that holds the fds of durable allocations.

While any process holds an fd of a memfd (or of an exported CUDA VMM allocation), the memory
stays allocated. The keeper holds those fds so durable memory outlives a crash or restart of
gpumemd; a restarted daemon fetches them back and re-adopts the memory.

Standard library only, and it never imports CUDA: it must not create a CUDA context, and it
must start fast. Run as `python -m daemon.keeper --socket PATH [--detach]`.

It serves the frame protocol of gpumemctl.protocol.framing on its own Unix socket, and only to
peers of its own uid (SO_PEERCRED). Requests (`op`):
  hello                    -> {pid, held}
  deposit {key, meta} +fds -> {} (replaces what was kept under key); refused with code 7
                              when the fds would pass its open-file limit, less KEEPER_SPARE
  withdraw {key}           -> {found}; the fds are closed, the memory freed if nobody else holds it
  list                     -> {keys: [{key, nfds, meta}]}
  fetch                    -> one frame per key, {key, meta} + its fds, then {done, count}
  watch                    -> no answer: the daemon keeps this connection open and learns of
                              the keeper's death from its EOF
  shutdown                 -> {}; then it exits, closing every fd it held
Its socket is recognised by device and inode (an inode number alone repeats across
filesystems). If the socket file is removed, it binds it again and goes on holding: durable
memory must not depend on nobody deleting a file (the state directory is the daemon's alone,
daemon/paths.py, so only root or the daemon's uid can). If it is replaced by another file,
someone else serves that name now (a new keeper, which the daemon re-deposits into), nobody
can reach this one again, and it exits rather than pin memory forever; so it does if its
directory is gone.
"""
from __future__ import annotations

import argparse
import os
import resource
import selectors
import signal
import socket
import stat
import struct
import sys
import time

from gpumemctl.protocol import framing  # standard library only

from ..core.fdbudget import raise_open_file_limit  # standard library only
from ..paths import file_id, replace_file  # standard library only

POLL_SECONDS = 2.0
# Descriptors the keeper keeps for itself under its open-file limit: stdio, its log, its
# socket and the daemon's connections, and room for the fds of a frame (at most
# framing.MAX_FDS_PER_FRAME) to arrive: a deposit past the rest is refused, never met with
# EMFILE, which would cut the fds off the frame and the connection with them.
KEEPER_SPARE = 32
NO_ROOM = 7              # the protocol's "no memory" code: keeper_link.py raises KeeperFull


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} gpumemd-keeper[{os.getpid()}]: {message}",
          file=sys.stderr, flush=True)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def bind_listener(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at `path`, 0700 (only our uid may connect), and its file's
    (device, inode). The keeper has one thread, so setting the umask around bind races
    with nothing here (unlike in gpumemd: daemon/paths.py, bind_unix)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o077)
    try:
        listener.bind(path)
    except OSError:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    listener.listen(16)
    return listener, file_id(os.lstat(path))


def claim(path: str) -> bool:
    """Make room for our socket: remove a stale one. False when a live keeper answers
    there (the daemon, which started us, will use that one): never take its name, or it
    would exit and free what it holds. A file that is not a socket is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"gpumemd-keeper: refusing {path}: it exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return True
    except TimeoutError:                 # a live keeper with a full backlog
        return False
    finally:
        probe.close()
    return False


class Keeper:
    def __init__(self, listener: socket.socket, path: str, ident: tuple[int, int]):
        self.listener = listener
        self.path = path
        self.ident = ident               # (st_dev, st_ino) of our socket file
        self.kept: dict[str, tuple[list[int], dict]] = {}
        self.held_fds = 0                  # of all that is kept
        self.sel = selectors.DefaultSelector()
        self.running = True

    # ---- requests -------------------------------------------------------------------
    def handle(self, conn: socket.socket, msg: dict, fds: list[int]) -> None:
        op, rid = msg.get("op"), msg.get("id")
        if op == "deposit":
            return self.deposit(conn, rid, str(msg["key"]), fds, msg.get("meta") or {})
        framing.close_fds(fds)  # only deposit carries fds
        result: dict[str, object]
        if op == "hello":
            result = {"pid": os.getpid(), "held": len(self.kept),
                      "fds": self.held_fds}
        elif op == "withdraw":
            result = {"found": self.drop(str(msg["key"]))}
        elif op == "list":
            result = {"keys": [{"key": k, "nfds": len(f), "meta": m}
                               for k, (f, m) in self.kept.items()]}
        elif op == "fetch":
            for key, (kfds, meta) in self.kept.items():
                framing.send_frame(conn, {"id": rid, "key": key, "meta": meta}, kfds)
            result = {"done": True, "count": len(self.kept)}
        elif op == "watch":
            return
        elif op == "shutdown":
            self.running = False
            result = {}
        else:
            return framing.send_frame(conn, {"id": rid, "ok": False, "error": {
                "code": 2, "message": f"unknown keeper op {op!r}"}})
        framing.send_frame(conn, {"id": rid, "ok": True, "result": result})

    def deposit(self, conn: socket.socket, rid, key: str, fds: list[int], meta: dict) -> None:
        """Keep `fds` under `key` (replacing what it held), unless they would pass the
        open-file limit (read each time: prlimit may change it), less KEEPER_SPARE."""
        old = self.kept.get(key)
        held = self.held_fds - (len(old[0]) if old else 0)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if held + len(fds) > limit - KEEPER_SPARE:
            framing.close_fds(fds)
            return framing.send_frame(conn, {"id": rid, "ok": False, "error": {
                "code": NO_ROOM, "message": f"the keeper holds {held} descriptors of durable "
                f"memory and {len(fds)} more would pass its open-file limit {limit}, less "
                f"the {KEEPER_SPARE} it keeps for itself; make some allocations transient "
                f"or remove them, or raise its limit: prlimit --pid {os.getpid()} "
                "--nofile=N:N"}})
        self.drop(key)
        self.kept[key] = (fds, meta)
        self.held_fds += len(fds)
        return framing.send_frame(conn, {"id": rid, "ok": True, "result": {}})

    def drop(self, key: str) -> bool:
        """Close what is kept under `key`; whether there was any."""
        old = self.kept.pop(key, None)
        if old:
            framing.close_fds(old[0])
            self.held_fds -= len(old[0])
        return old is not None

    # ---- loop -------------------------------------------------------------------------
    def accept(self) -> None:
        conn, _ = self.listener.accept()
        if peer_uid(conn) != os.getuid():
            log(f"refused a peer of uid {peer_uid(conn)}")
            conn.close()
            return
        conn.settimeout(10)
        self.sel.register(conn, selectors.EVENT_READ, data=conn)   # data: the socket, typed

    def serve_one(self, conn: socket.socket) -> None:
        try:
            msg, fds = framing.recv_frame(conn, framing.MAX_REQUEST_BYTES)
            self.handle(conn, msg, fds)
        except (EOFError, OSError, framing.ProtocolError, KeyError) as exc:
            if not isinstance(exc, EOFError):
                log(f"dropping a connection: {exc}")
            self.sel.unregister(conn)
            conn.close()

    def socket_still_ours(self) -> bool:
        try:
            return file_id(os.lstat(self.path)) == self.ident
        except OSError:
            return False

    def keep_socket(self) -> bool:
        """Whether we can still be reached at our path: a removed socket is bound again;
        False when another file took the name or the directory is gone."""
        if self.socket_still_ours():
            return True
        if os.path.lexists(self.path):
            log(f"socket {self.path} was replaced by another file")
            return False
        try:
            listener, ident = bind_listener(self.path)
        except OSError as exc:             # the directory went, or a new file raced us
            log(f"socket {self.path} was removed and cannot be bound again: {exc}")
            return False
        self.sel.unregister(self.listener)
        self.listener.close()
        self.listener, self.ident = listener, ident
        self.sel.register(self.listener, selectors.EVENT_READ)
        log(f"socket {self.path} was removed; bound it again, still holding "
            f"{len(self.kept)} allocations")
        return True

    def run(self) -> None:
        self.sel.register(self.listener, selectors.EVENT_READ)
        last_check = time.monotonic()
        while self.running:
            for key, _ in self.sel.select(POLL_SECONDS):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.serve_one(key.data)
            if time.monotonic() - last_check >= POLL_SECONDS:
                last_check = time.monotonic()
                if not self.keep_socket():
                    log(f"nobody can reach this keeper at {self.path}; exiting and "
                        f"releasing {len(self.kept)} allocations")
                    break
        for fds, _ in self.kept.values():
            framing.close_fds(fds)
        if self.socket_still_ours():
            os.unlink(self.path)
        log("stopped")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpumemd-keeper")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--pidfile")
    parser.add_argument("--detach", action="store_true",
                        help="fork into the background once the socket listens")
    args = parser.parse_args(argv)
    # gpumemd blocks its stop signals (daemon/signals.py), and a child inherits the mask.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raise_open_file_limit()       # every fd of durable memory is one of ours
    if not claim(args.socket):
        log(f"another keeper serves {args.socket}; leaving it to that one")
        return 0
    listener, ident = bind_listener(args.socket)
    if args.detach:
        child = os.fork()
        if child:
            if args.pidfile:
                write_pidfile(args.pidfile, child)
            os._exit(0)
        os.setsid()
    elif args.pidfile:
        write_pidfile(args.pidfile, os.getpid())
    log(f"holding fds for {args.socket}")
    Keeper(listener, args.socket, ident).run()
    return 0


def write_pidfile(path: str, pid: int) -> None:
    """Never through a symlink, never into an existing file (paths.replace_file)."""
    replace_file(path, f"{pid}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
