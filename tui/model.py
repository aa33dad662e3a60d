"""What the monitor shows, computed from the daemon's JSON: no Textual and no I/O here, so
the table logic is fast, and testable without a terminal.

A `Snapshot` is one consistent look at the daemon (`status` plus `ls -R` of the root),
taken by a worker thread. The allocations table shows the entries of one directory (or,
while a filter is typed, every entry below it whose path matches), sorted by one column.
"""
from __future__ import annotations

import dataclasses
import time

from gpumemctl.formats import age, epoch  # noqa: F401 - epoch: model.epoch, as before
from gpumemctl.protocol import format_size
from gpumemctl.protocol.replies import Device, Node, ScrubSummary, Status


@dataclasses.dataclass
class Snapshot:
    status: Status                    # `status`: daemon, keeper, devices, totals, scrub
    entries: list[Node]               # `ls -R` of the root: nodes, parents before children
    fetched_ms: float = 0.0           # how long the two calls took
    taken_at: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.by_path = {e["path"]: e for e in self.entries}
        self.device_index = {d["uuid"]: d["index"] for d in self.status.get("devices", [])}

    @property
    def devices(self) -> list[Device]:
        return self.status.get("devices", [])

    @property
    def scrub(self) -> ScrubSummary:
        return self.status.get("scrub", {})


# (key, header): the allocation table's columns, in order. `sort_value` sorts by key.
COLUMNS = [("name", "NAME"), ("size", "SIZE"), ("capacity", "CAPACITY"),
           ("device", "DEV"), ("durable", "DURABLE"), ("state", "STATE"),
           ("holders", "HOLDERS"), ("links", "LN"), ("ecc", "ECC"),
           ("verified", "VERIFIED"), ("snapshot", "SNAPSHOT")]
COLUMN_KEYS = [key for key, _ in COLUMNS]


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def relative(path: str, cwd: str) -> str:
    return path[len(cwd) + 1:] if cwd else path


def holders(entry: Node) -> int:
    """Holders without the durable pin (docs/design.md: refcount = holders + durable pin)."""
    if entry["type"] != "allocation":
        return 0
    return entry.get("refcount", 0) - (1 if entry.get("durable") else 0)


def visible(entries: list[Node], cwd: str, text: str) -> list[Node]:
    """The entries the table shows: the children of `cwd`, or with a filter, every entry
    below `cwd` whose path (relative to cwd) contains the text, ignoring case."""
    if not text:
        return [e for e in entries if parent_of(e["path"]) == cwd]
    prefix, needle = (cwd + "/" if cwd else ""), text.lower()
    return [e for e in entries if e["path"].startswith(prefix)
            and needle in relative(e["path"], cwd).lower()]


def sort_value(entry: Node, key: str, device_index: dict):
    """A sort key: directories first, then by the column; a missing value sorts last."""
    value: object
    if key == "name":
        value = entry["path"].lower()
    elif key == "holders":
        value = holders(entry) if entry["type"] == "allocation" else None
    elif key == "device":
        value = device_index.get(entry["device"]) if entry["type"] == "allocation" else None
    elif key == "snapshot":
        value = entry.get("snapshot_time")       # ISO times sort as times
    else:
        value = entry.get(key)
    if isinstance(value, bool):
        value = int(value)
    return (entry["type"] != "directory", value is None, value if value is not None else 0)


def sorted_entries(entries: list[Node], key: str, reverse: bool, device_index: dict
                   ) -> list[Node]:
    rows = sorted(entries, key=lambda e: sort_value(e, key, device_index), reverse=reverse)
    if reverse:   # directories stay on top either way
        rows.sort(key=lambda e: e["type"] != "directory")
    return rows


def device_label(uuid: str | None, device_index: dict) -> str:
    if not uuid:
        return "-"
    index = device_index.get(uuid)
    return str(index) if index is not None else uuid[:8]


def row_cells(entry: Node, cwd: str, device_index: dict, now: float) -> tuple[str, ...]:
    """The table's text for one entry (the order of COLUMNS)."""
    name = relative(entry["path"], cwd)
    links = str(entry.get("links", ""))     # st_nlink: a hard-linked file's names
    if entry["type"] == "directory":
        return (name + "/", "", "", "", "", "dir", "", links, "", f"{entry['entries']} entries",
                "")
    if entry["type"] == "symlink":       # metadata only: the target is what there is to show
        return (f"{name} -> {entry['target']}", "", "", "", "", "link", "", links, "", "", "")
    if entry["type"] != "allocation":    # a FIFO, socket or device node (no memory)
        return (name, "", "", "", "", entry["type"], "", links, "", "", "")
    size = "-" if entry["size"] is None else format_size(entry["size"])
    capacity = "-" if entry["capacity"] is None else format_size(entry["capacity"])
    verified = "-" if entry["ecc"] != "rs" else age(entry.get("verified"), now)
    state = entry["state"] + ("*" if entry.get("unsealed") else "")
    return (name, size, capacity, device_label(entry["device"], device_index),
            "durable" if entry["durable"] else "transient", state, str(holders(entry)),
            links, entry["ecc"], verified, age(entry.get("snapshot_time"), now))


def rate_text(bytes_per_s: float | None) -> str:
    return "-" if not bytes_per_s else f"{format_size(int(bytes_per_s))}/s"
