"""Defaults shared by the daemon and the client: paths (docs/design.md, "Defaults") and the
defaults of request arguments (docs/protocol.md). Each is defined here once: the daemon's op
table (daemon/server/ops.py), the client library and the CLI all take them from here."""
from __future__ import annotations

import os

PROTOCOL_VERSION = 1
SOCKET_ENV = "GPUMEMD_SOCKET"

# Request arguments a client may leave out (docs/protocol.md, "Requests and answers").
FILE_MODE = 0o600           # a new allocation is private unless asked otherwise
DIR_MODE = 0o755            # a new directory
OPEN_MODE = "r"             # `open`/`attach`: read-only unless asked for "rw"
EVENTS_LIMIT = 100          # `events`/`subscribe`: the most events in one answer...
EVENTS_MAX_LIMIT = 10_000   # ...and the bound a larger `limit` is brought down to
READ_COPY_BYTES = 4 << 20   # `read` (by copy): the most bytes one answer carries
SCRUB_ACTION = "status"     # `scrub` without an action reports
CORRUPT_PATTERN = "ff"      # `debug_corrupt`: the hex bytes written over the range
# Snapshots: the block the format checksums (gpumemctl/snapshots/manifest.py) and the unit
# in which the daemon tracks what changed since a snapshot (op `changes`).
SNAPSHOT_BLOCK = 1 << 20
# Many objects at once (`create_many`, `remove_many`, `read_many`, `write_many`; docs/
# protocol.md): the most items one request takes (more: the request is refused whole), and
# the most bytes of data one `read_many` answer carries (the items past it are left out, and
# the client library asks for them again). A `write_many` is bounded by the request's
# 1 MiB (framing.MAX_REQUEST_BYTES); the client library sends an item's data in pieces of
# BATCH_WRITE_PIECE bytes, so that any item fits.
BATCH_MAX_ITEMS = 1024
BATCH_READ_BYTES = 16 << 20
BATCH_WRITE_PIECE = 512 << 10


def default_socket() -> str:
    if os.environ.get(SOCKET_ENV):
        return os.environ[SOCKET_ENV]
    if os.geteuid() == 0:
        return "/run/gpumemd/gpumemd.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return os.path.join(runtime, "gpumemd.sock")


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/var/lib/gpumemd"
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "gpumemd")
