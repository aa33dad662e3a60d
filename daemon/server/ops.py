"""The op table: every request gpumemd answers, defined here once.

Each op has its handler, its argument schema (name, type, default or required, bounds) and
how it answers: once (`handler`), as a stream (`stream`, always or when the bool argument
`stream_when` is true), or once after progress frames (when the bool argument
`progress_when` is true). Defaults a client may leave out come from
gpumemctl/protocol/defaults.py, which the client library and the CLI use too. docs/protocol.md
documents exactly these ops and arguments (tests/integration/test_op_schema.py holds them
together).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable

from gpumemctl.protocol import UsageError
from gpumemctl.protocol.defaults import (
    CORRUPT_PATTERN,
    DIR_MODE,
    EVENTS_LIMIT,
    EVENTS_MAX_LIMIT,
    FILE_MODE,
    OPEN_MODE,
    PROTOCOL_VERSION,
    READ_COPY_BYTES,
    SCRUB_ACTION,
)

from ..verbs.refill import REPORT_ACTIONS, REPORT_RESULTS
from . import allocations, batch, compaction, refilling, sleep, status, streams, verify
from .call import Call, Reply
from .schema import REQUIRED, Arg, Kind
from .transport import Connection

Handler = Callable[[Call], Awaitable[Reply]]
StreamHandler = Callable[[Call, Connection], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Arg, ...]
    handler: Handler | None = None          # answers once
    stream: StreamHandler | None = None     # answers, then pushes frames until hang-up
    stream_when: str | None = None          # the bool argument that makes it a stream
    progress_when: str | None = None        # the bool argument that asks for progress frames

    def __post_init__(self) -> None:
        names = {a.name for a in self.args}
        for flag in (self.stream_when, self.progress_when):
            assert flag is None or flag in names, f"{self.name}: no argument {flag!r}"
        assert self.handler or (self.stream and not self.stream_when), self.name

    def streams(self, args: dict) -> bool:
        if self.stream is None:
            return False
        return self.stream_when is None or args[self.stream_when]

    def wants_progress(self, args: dict) -> bool:
        return self.progress_when is not None and args[self.progress_when]


async def hello_again(call: Call) -> Reply:
    """`hello` is the handshake (service.py reads it); as a later request it is a mistake."""
    raise UsageError("'hello' is the first request of a connection, and only that")


# ---- arguments that several ops share -------------------------------------------------------

def path(default: object = REQUIRED) -> Arg:
    """An allocation or directory name. The verbs hold it to the name rules
    (gpumemctl/protocol/names.py: lengths, components), in their own words."""
    return Arg("path", Kind.STR, default)


def flag(name: str) -> Arg:
    return Arg(name, Kind.BOOL, False)


def events_limit() -> Arg:
    return Arg("limit", Kind.INT, EVENTS_LIMIT, clamp=(1, EVENTS_MAX_LIMIT))


# An event id: SQLite's integers stop at 2**63 - 1 (a `since` past it was an internal error);
# one past every id there is answers no events, as any since past the last one does.
SINCE_RANGE = (0, 2**63 - 1)
OPEN = Arg("mode", Kind.STR, OPEN_MODE, what="'r' or 'rw'")
HANDLE = Arg("handle", Kind.INT)
# User metadata (issue 17, daemon/core/usermeta.py): a key, and {key: value} of a new allocation.
KEY = Arg("key", Kind.STR, what="a metadata key (a string)")
METADATA = Arg("metadata", Kind.OBJECT, None, what="an object of metadata keys and string "
                                                   "values")
CREATE = (path(), Arg("size", Kind.INT, what="a size in bytes (an integer)"),
          flag("durable"), Arg("mode", Kind.INT, FILE_MODE),
          Arg("device", Kind.DEVICE, None),
          # None: the daemon's default (config `ecc`); older clients always send one.
          Arg("ecc", Kind.STR, None), flag("exist_ok"), flag("lease"), METADATA)
OFFSET = Arg("offset", Kind.INT, 0, what="a byte offset (an integer)")
READ = (path(), OFFSET, Arg("length", Kind.INT, clamp=(0, READ_COPY_BYTES),
                            what="a number of bytes (an integer)"),
        Arg("id", Kind.INT, None, nullable=True, what="the allocation's id (an integer)"))
# Many objects at once (daemon/server/batch.py): the list, and the schema of each item, which
# is checked item by item (an item's bad field is that item's error, not the request's).
ITEMS = Arg("items", Kind.LIST, what="a list of objects, one per item")
READ_ITEM = (path(), OFFSET, Arg("length", Kind.INT, None, clamp=(0, READ_COPY_BYTES),
                                 what="a number of bytes (an integer), or null: to the end"))
WRITE_ITEM = (path(), OFFSET, Arg("data", Kind.STR, what="the bytes to write, base64"))


# ---- the table --------------------------------------------------------------------------------

OPS: dict[str, Op] = {op.name: op for op in (
    # The handshake (service.py reads these two itself); a later `hello` is an error.
    Op("hello", (Arg("version", Kind.INT, what=f"the protocol version, {PROTOCOL_VERSION}"),
                 Arg("client", Kind.STR, "")), hello_again),
    # `limit` or `after` asks for one page and its `next` cursor (daemon/core/listing.py);
    # without either, the whole listing comes in one answer, as older clients expect.
    Op("ls", (path(""), flag("recursive"), Arg("after", Kind.STR, None,
                                              what="the `next` of the previous page"),
              Arg("limit", Kind.INT, None, clamp=(1, EVENTS_MAX_LIMIT))), allocations.ls),
    Op("info", (path(),), allocations.info),
    Op("create", CREATE, allocations.create),
    Op("mkdir", (path(), Arg("mode", Kind.INT, DIR_MODE), flag("parents")), allocations.mkdir),
    Op("rm", (path(), flag("recursive"), flag("force")), allocations.rm),
    # Symbolic links (issue 15): the target is any string of 1-4095 bytes, kept as given.
    Op("symlink", (path(), Arg("target", Kind.STR, what="the link's target (a string)")),
       allocations.symlink),
    Op("readlink", (path(),), allocations.readlink),
    Op("link", (path(), Arg("target", Kind.STR, what="an existing name (not followed)")),
       allocations.link),
    Op("durable", (path(), flag("durable")), allocations.durable),
    # Issue 27: rename and resize through the socket (`gpumemctl mv`, `gpumemctl resize`).
    Op("rename", (path(), Arg("to", Kind.STR, what="the new path (a string)"),
                  flag("no_replace")), allocations.rename),
    Op("resize", (path(), Arg("size", Kind.INT, what="a size in bytes (an integer)")),
       allocations.resize),
    Op("open", (path(), OPEN, flag("regions"), flag("extents")), allocations.open_),
    Op("read", READ, allocations.read),
    Op("close", (HANDLE, Arg("written", Kind.OBJECT, None), Arg("restored", Kind.OBJECT, None)),
       allocations.close),
    # Snapshots (issue 16): the client moves the data; these let it fill memory it may
    # write, and tell the daemon what it did (docs/snapshots.md).
    Op("refill", (path(), Arg("size", Kind.INT, what="a size in bytes (an integer)"),
                  Arg("mode", Kind.INT, FILE_MODE), Arg("ecc", Kind.STR, None),
                  flag("durable"), Arg("device", Kind.DEVICE, None), flag("force"),
                  flag("unsealed"), METADATA, flag("extents")),
       allocations.refill),
    # Issue 29: a refill's written bytes, reported while it writes, encoded meanwhile.
    Op("refill_written", (HANDLE, Arg("ranges", Kind.LIST,
                                      what="a list of [start, end] byte ranges")),
       refilling.refill_written),
    Op("changes", (HANDLE, flag("reset")), allocations.changes),
    Op("snapshot_report", (Arg("action", Kind.STR, REQUIRED, choices=REPORT_ACTIONS),
                           Arg("snapshot", Kind.STR, ""),
                           Arg("location", Kind.STR, ""),
                           Arg("result", Kind.STR, REQUIRED, choices=REPORT_RESULTS),
                           Arg("bytes", Kind.INT, 0), Arg("bytes_written", Kind.INT, 0),
                           Arg("duration_ms", Kind.INT, 0), Arg("allocations", Kind.INT, 0),
                           flag("incremental"), Arg("io", Kind.STR, ""),
                           Arg("paths", Kind.STR_LIST, None)),
       allocations.snapshot_report),
    # User metadata (issue 17): small key-value pairs on allocations and directories.
    Op("meta_list", (path(),), allocations.meta_list),
    Op("meta_get", (path(), KEY), allocations.meta_get),
    Op("meta_set", (path(), KEY, Arg("value", Kind.STR, what="the value (a string)"),
                    flag("create"), flag("replace")), allocations.meta_set),
    Op("meta_rm", (path(), KEY), allocations.meta_rm),
    Op("attach", (path(), OPEN, flag("regions"), flag("extents")), allocations.attach),
    # Sleep and wake (issue 28): `parked`, the caller's process's attachments that let go
    # of their mapping; `remap` maps an attachment again where it kept its address.
    Op("sleep", (path(), Arg("parked", Kind.LIST, None, nullable=True,
                             what="a list of attachment handles (integers)")), sleep.sleep),
    Op("wake", (path(),), sleep.wake),
    Op("remap", (HANDLE, flag("regions"), flag("extents")), sleep.remap),
    Op("revoke", (path(),), allocations.revoke),
    Op("detach", (HANDLE,), allocations.detach),
    Op("seal", (path(),), allocations.seal),
    Op("export_dmabuf", (path(),), allocations.export_dmabuf),
    Op("status", (), status.status),
    Op("devices", (), status.devices),
    Op("events", (Arg("since", Kind.INT, 0, clamp=SINCE_RANGE), events_limit(),
                  Arg("path", Kind.STR, None), flag("follow")),
       streams.events, stream=streams.follow_events, stream_when="follow"),
    Op("subscribe", (Arg("since", Kind.INT, None, clamp=SINCE_RANGE), events_limit()),
       stream=streams.subscribe),
    Op("verify", (Arg("paths", Kind.STR_LIST, [], nullable=True), flag("all"), flag("repair"),
                  flag("progress")), verify.verify, progress_when="progress"),
    Op("recover", (path(), flag("progress")), verify.recover, progress_when="progress"),
    Op("check", (flag("repair"),), verify.check),
    Op("scrub", (Arg("action", Kind.STR, SCRUB_ACTION, choices=("start", "stop", "status")),
                 Arg("rate", Kind.INT, None, what="bytes per second (an integer)")),
       verify.scrub),
    # Slabs compacted (issue 26, docs/storage.md): the administrator only.
    Op("compact", (flag("dry_run"),), compaction.compact),
    # Many objects at once (issue 26): one result per item, in order (daemon/server/batch.py).
    Op("create_many", (ITEMS,), functools.partial(batch.create_many, CREATE)),
    Op("remove_many", (Arg("paths", Kind.STR_LIST, what="a list of names (strings)"),
                       flag("recursive"), flag("force")), batch.remove_many),
    Op("read_many", (ITEMS,), functools.partial(batch.read_many, READ_ITEM)),
    Op("write_many", (ITEMS,), functools.partial(batch.write_many, WRITE_ITEM)),
    Op("debug_corrupt", (path(), Arg("offset", Kind.INT), Arg("length", Kind.INT),
                         Arg("pattern", Kind.STR, CORRUPT_PATTERN), flag("parity")),
       verify.debug_corrupt),
    # GPU health (issue 28): an incident injected as if NVML reported it (fault injection).
    Op("debug_gpu_event", (Arg("device", Kind.INT), Arg("xid", Kind.INT, None),
                           Arg("ecc", Kind.STR, None, choices=("double",)), flag("remap")),
       status.debug_gpu_event),
)}


def lookup(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise UsageError(f"unknown request {name!r}") from None
