"""The keeper: a tiny process that holds the fds of durable allocations.

While any process holds an fd of a memfd (or of an exported CUDA VMM allocation), the memory
stays allocated. The keeper holds those fds so durable memory outlives a crash or restart of
gpumemd; a restarted daemon fetches them back and re-adopts the memory.

Standard library only, and it never imports CUDA: it must not create a CUDA context, and it
must start fast. Run as `python -m daemon.keeper --socket PATH [--detach]`.

It serves the frame protocol of gpumemctl.protocol.framing on its own Unix socket, and only to
peers of its own uid (SO_PEERCRED). Requests (`op`):
  hello                    -> {pid, held}
  deposit {key, meta} +fds -> {} (replaces what was kept under key)
  withdraw {key}           -> {found}; the fds are closed, the memory freed if nobody else holds it
  list                     -> {keys: [{key, nfds, meta}]}
  fetch                    -> one frame per key, {key, meta} + its fds, then {done, count}
  watch                    -> no answer: the daemon keeps this connection open and learns of
                              the keeper's death from its EOF
  shutdown                 -> {}; then it exits, closing every fd it held
If its socket file is removed or replaced, nobody can reach it again, so it exits rather than
pin memory forever.
"""
from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import struct
import sys
import time

from gpumemctl.protocol import framing  # standard library only

POLL_SECONDS = 2.0


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} gpumemd-keeper[{os.getpid()}]: {message}",
          file=sys.stderr, flush=True)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class Keeper:
    def __init__(self, listener: socket.socket, path: str):
        self.listener = listener
        self.path = path
        self.inode = os.stat(path).st_ino
        self.kept: dict[str, tuple[list[int], dict]] = {}
        self.sel = selectors.DefaultSelector()
        self.running = True

    # ---- requests -------------------------------------------------------------------
    def handle(self, conn: socket.socket, msg: dict, fds: list[int]) -> None:
        op, rid = msg.get("op"), msg.get("id")
        if op == "deposit":
            key = str(msg["key"])
            old = self.kept.pop(key, None)
            if old:
                framing.close_fds(old[0])
            self.kept[key] = (fds, msg.get("meta") or {})
            return framing.send_frame(conn, {"id": rid, "ok": True, "result": {}})
        framing.close_fds(fds)  # only deposit carries fds
        result: dict[str, object]
        if op == "hello":
            result = {"pid": os.getpid(), "held": len(self.kept),
                      "fds": sum(len(f) for f, _ in self.kept.values())}
        elif op == "withdraw":
            old = self.kept.pop(str(msg["key"]), None)
            if old:
                framing.close_fds(old[0])
            result = {"found": old is not None}
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
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

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
                if not self.socket_still_ours():
                    log(f"socket {self.path} is gone; exiting and releasing "
                        f"{len(self.kept)} allocations")
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    old_umask = os.umask(0o077)
    listener.bind(args.socket)
    os.umask(old_umask)
    listener.listen(16)
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
    Keeper(listener, args.socket).run()
    return 0


def write_pidfile(path: str, pid: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{pid}\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
