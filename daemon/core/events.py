"""What an event-log entry may carry: a schema per event kind, and the size bounds.

Every event the daemon records (`gpumemctl events`, the `event ...` log line) has a `detail`
object. Some of it comes from clients (a `close` tells which range it wrote), so it is never
stored as sent: `bound_detail()` keeps only the keys SCHEMA names for the kind, with the
types named there, and bounds the result:
- a key the schema does not name, or a value of another type, is dropped (`dropped_keys`
  then says how many were);
- a string longer than STRING_LIMIT characters is cut, ending in a marker that says how many
  characters were cut;
- a list longer than LIST_LIMIT items is replaced by a summary: `{count, first, last}`, and
  for byte ranges (`[start, end]` pairs) also `bytes`, the total they cover;
- the whole object, as JSON, is at most DETAIL_LIMIT bytes: the longest strings are cut
  further until it fits.
A kind the schema does not know (a new one added without its entry here) keeps its scalar
values, bounded the same way. tests/unit/test_event_schema.py checks that every kind and key
the daemon's code emits is listed.

No client writes text into a detail: the one detail a client reports (CLIENT_REPORTED) has
numbers only, so a string a client sends there is dropped. Every other string is the
daemon's: its own words, a mode it formats, or a name it holds. A name is chosen by a client
and may hold any character, so whoever shows a detail to a person escapes it
(gpumemctl/protocol/escape.py: the CLI, the monitor, the daemon's log formatter).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable

DETAIL_LIMIT = 4096       # bytes of JSON per event detail
STRING_LIMIT = 1024       # characters of one string value
LIST_LIMIT = 16           # items of a list kept as they are; longer ones are summarised
STRS_ITEM_LIMIT = 256     # characters of one string of a "strs" list
KEY_LIMIT = 64            # characters of a key name (unknown kinds only)
LINE_PATH_LIMIT = 1024    # characters of the path shown in the log line
INT_RANGE = (-(1 << 63), (1 << 64) - 1)   # what SQLite and every reader can hold

# Value types: "str", "int", "bool", "ints" (a list of integers, e.g. block numbers),
# "ranges" (a list of [start, end) byte ranges), "strs" (a list of strings, e.g. the first
# names a gpu_health event names: each cut to STRS_ITEM_LIMIT). Any value may also be null.
_REASON = {"reason": "str"}
# The kinds whose detail a client reports: typed numbers only, never "str" (a test holds it).
CLIENT_REPORTED = frozenset({"write"})
SCHEMA: dict[str, dict[str, str]] = {
    "start": {"backend": "str", "adopted": "int", "lost": "int", "orphans_freed": "int",
              "orphans_adopted": "int", "transients_dropped": "int",
              "parity_rebuilt_blocks": "int", "shared_blocks_encoded": "int",
              "recovery_dir": "str"},
    "stop": {},
    "drop": _REASON,
    "adopt": {"capacity": "int", "key": "int", "recovered": "bool", "slab": "int",
              "objects": "int", "asleep": "bool"},
    # Sleep and wake (issue 28, daemon/core/sleep.py): the bytes moved; `parked`: the
    # attachments that keep their address; `corrected`/`uncorrectable`: the wake's check.
    "sleep": {"bytes": "int", "parked": "int"},
    "wake": {"bytes": "int", "corrected": "int", "uncorrectable": "int"},
    "lost": _REASON,
    "orphan": {"key": "int", **_REASON},
    "parity": {"action": "str", **_REASON},
    "keeper": {"action": "str", "redeposited": "int", "withdrawn": "int"},
    "mkdir": {"mode": "str"},
    # `container` (create, seal, unsealed, release): the container id of the session or
    # holder the event is about, where it ran in one (daemon/core/containers.py: the
    # daemon's reading of its cgroup, an id of [0-9a-zA-Z_.-] only).
    "create": {"size": "int", "capacity": "int", "device": "str", "durable": "bool",
               "lease": "bool", "state": "str", "metadata_keys": "int", "container": "str"},
    # User metadata (issue 17): a key set or removed (`action` set or rm; `bytes`: the
    # value's size), or all of it replaced by a restore (`action` replace, `keys`). Never
    # a value: those are the user's data.
    "meta": {"action": "str", "key": "str", "bytes": "int", "keys": "int"},
    # `name`, `links_left`: one name of a hard-linked node went, others keep it (its
    # memory stays); `path` is then the node's first name left.
    "remove": {"force": "bool", "replaced_by": "str", "name": "str", "links_left": "int"},
    "link": {"name": "str", "links": "int"},
    "durable": {},
    "transient": {},
    "resize": {"size": "int", "capacity": "int", "old_size": "int"},
    "rename": {"from": "str", "to": "str", "exchange": "bool"},
    "symlink": {"target": "str"},
    "mknod": {"type": "str", "mode": "str", "rdev": "int"},
    "setattr": {"mode": "str", "uid": "int", "gid": "int", "modified_ns": "int",
                "accessed_ns": "int", "changed_ns": "int"},
    # A client's `close` reports what it wrote: `offset` and `bytes` (gpumemctl.Client), or
    # a list of `ranges`, which is summarised when long.
    # `range_unknown`: the daemon's note at start that a writer was open when it stopped.
    "write": {"offset": "int", "bytes": "int", "ranges": "ranges", "range_unknown": "bool"},
    "seal": {"container": "str", **_REASON},
    "unsealed": {"container": "str", **_REASON},
    "release": {"container": "str", **_REASON},
    "revoke": {"holders": "int"},
    "damage": {"blocks": "ints", "ranges": "ranges", **_REASON},
    "healed": {"blocks": "ints", **_REASON},
    "corrupt": {"offset": "int", "length": "int", "parity": "bool"},
    "compact": {"asked": "bool", "moved": "int", "moved_bytes": "int", "slabs_freed": "int",
                "freed_bytes": "int"},
    "scrub": {"action": "str", "rate": "int", "bytes": "int", "corrected": "int",
              "uncorrectable": "int", "skipped": "int"},
    # Snapshots (issue 16): an allocation's refill (`action` begin, done or abandoned), and
    # a client's report of a whole snapshot create, restore or verify (daemon/verbs/refill.py).
    "restore": {"action": "str", "damaged_blocks": "int"},
    "snapshot": {"action": "str", "snapshot": "str", "location": "str", "result": "str",
                 "bytes": "int", "bytes_written": "int", "duration_ms": "int",
                 "allocations": "int", "incremental": "bool", "io": "str"},
    # GPU health (issue 28, daemon/services/health.py): what NVML (or `debug gpu-event`)
    # reported of a device, and the allocations on it. One event without names (uid null:
    # every user sees it) and one per owner naming that owner's allocations: `allocations`
    # the count, `paths`/`ids` the first GPU_HEALTH_NAMED. `action` "verified" follows the
    # verify started at once (clean, corrected, uncorrectable: blocks).
    "gpu_health": {"action": "str", "device": "str", "index": "int", "cause": "str",
                   "xid": "int", "state": "str", "injected": "bool", "allocations": "int",
                   "paths": "strs", "ids": "ints", "lost": "int", "verified": "int",
                   "clean": "int", "corrected": "int", "uncorrectable": "int",
                   "failed": "int"},
}


def bound_detail(kind: str, detail: dict) -> dict:
    """The detail as stored and logged: schema-checked and bounded (module docstring)."""
    allowed = SCHEMA.get(kind)
    out: dict = {}
    dropped = 0
    for key, value in detail.items():
        kept = _checked(key, value, allowed)
        if kept is _DROP:
            dropped += 1
        else:
            out[key] = kept
    if dropped:
        out["dropped_keys"] = dropped
    return _fit(out)


_DROP = object()


def _checked(key, value, allowed: dict[str, str] | None):
    """The value to keep under `key`, bounded; _DROP when the schema does not allow it."""
    if allowed is None:                       # a kind without a schema: scalars only
        if not isinstance(key, str) or len(key) > KEY_LIMIT:
            return _DROP
        kind = _scalar_type(value)
    else:
        kind = allowed.get(key)
    if kind is None:
        return _DROP
    if value is None:
        return None
    if kind == "str":
        return cut(value) if isinstance(value, str) else _DROP
    if kind == "bool":
        return value if isinstance(value, bool) else _DROP
    if kind == "int":
        return value if _is_int(value) else _DROP
    if kind == "ints":
        return _list(value, _is_int)
    if kind == "strs":
        kept = _list(value, lambda v: isinstance(v, str))
        return kept if kept is _DROP else _cut_strs(kept)
    return _list(value, _is_range)            # "ranges"


def _cut_strs(value):
    """A "strs" list (or its summary) with each string cut to STRS_ITEM_LIMIT."""
    if isinstance(value, dict):
        return {k: cut(v, STRS_ITEM_LIMIT) if isinstance(v, str) else v
                for k, v in value.items()}
    return [cut(v, STRS_ITEM_LIMIT) for v in value]


def _scalar_type(value) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if _is_int(value):
        return "int"
    if isinstance(value, str):
        return "str"
    return "str" if value is None else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) \
        and INT_RANGE[0] <= value <= INT_RANGE[1]


def _is_range(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 \
        and all(_is_int(v) for v in value) and value[0] <= value[1]


def _list(value, item_ok):
    if not isinstance(value, (list, tuple)) or not all(item_ok(v) for v in value):
        return _DROP
    items = [list(v) if isinstance(v, tuple) else v for v in value]
    if len(items) <= LIST_LIMIT:
        return items
    summary = {"count": len(items), "first": items[0], "last": items[-1]}
    if item_ok is _is_range:
        summary["bytes"] = sum(end - start for start, end in items)
    return summary


def cut(text: str, limit: int = STRING_LIMIT) -> str:
    """`text`, or its first characters and a marker saying how many were cut."""
    if len(text) <= limit:
        return text
    keep = max(limit - 32, 0)
    return f"{text[:keep]}...[{len(text) - keep} more characters]"


# What one key or value can take as JSON at most: a string 12 characters per character
# (ensure_ascii spells one outside the BMP as two "\\uXXXX"), plus quotes and separators.
_JSON_PER_CHAR, _JSON_PER_ITEM = 12, 32


def _fits_surely(detail: dict) -> bool:
    """Whether the JSON of `detail` is within DETAIL_LIMIT whatever its strings hold, counted
    without encoding it (most details: a few numbers and short words)."""
    bound = 2
    for key, value in detail.items():
        if isinstance(value, str):
            bound += _JSON_PER_CHAR * len(value)
        elif not (value is None or isinstance(value, (bool, int))):
            return False                         # a list or summary: encode and see
        bound += _JSON_PER_CHAR * len(key) + _JSON_PER_ITEM
    return bound <= DETAIL_LIMIT


def _fit(detail: dict) -> dict:
    """Cut the longest strings until the JSON fits DETAIL_LIMIT (every other value is small:
    ints, bools, and lists of at most LIST_LIMIT small items or their summary)."""
    if _fits_surely(detail):
        return detail
    original = {k: v for k, v in detail.items() if isinstance(v, str)}
    while len(json.dumps(detail, sort_keys=True)) > DETAIL_LIMIT:
        strings = [k for k, v in detail.items() if isinstance(v, str) and len(v) > 64]
        if strings:
            longest = max(strings, key=lambda k: len(detail[k]))
            detail[longest] = cut(original[longest], len(detail[longest]) // 2)
            continue
        if _shorten_strs(detail):
            continue
        # Only reachable for a kind without a schema that carries very many keys.
        victim = next(k for k in reversed(detail) if k != "dropped_keys")
        del detail[victim]
        detail["dropped_keys"] = detail.pop("dropped_keys", 0) + 1
    return detail


def _shorten_strs(detail: dict) -> bool:
    """Halve the strings of the longest "strs" list (or drop its last item once they are
    short); whether anything was shortened."""
    lists = [k for k, v in detail.items() if isinstance(v, list) and v
             and all(isinstance(s, str) for s in v)]
    if not lists:
        return False
    key = max(lists, key=lambda k: sum(len(s) for s in detail[k]))
    items = detail[key]
    longest = max(len(s) for s in items)
    if longest > 64:
        detail[key] = [cut(s, longest // 2) for s in items]
    else:
        detail[key] = items[:-1]
    return True


def visible_to(event: dict, uid: int, *, administrator: bool) -> bool:
    """Whether a user other than root and the daemon's (who see every event) may see
    `event`: their own; the daemon's own node-less ones (start, stop, keeper, scrub); and,
    for a member of admin_group, every user's node-less ones too. A node-less event of a
    user is a snapshot report: it names places in that user's store and tree, and one
    user's thousands of them must not fill another's `events` (issue 24). Events about
    a node stay with its user: paths in private directories must not leak through the log.
    registry.event_log.page asks the same in SQL."""
    if event["uid"] == uid:
        return True
    return event["node"] is None and (event["uid"] is None or administrator)


class LineBudget:
    """How many `event ...` log lines each user's events may write: LINES_BURST at once,
    then LINES_PER_SECOND (a token bucket per uid). Past it a user's lines are counted, not
    written, and the next line written says how many were left out: one user's loop of
    creates cannot fill the daemon's log (docs/security.md). The events themselves are all in
    the event log. Root, the daemon's uid and daemon-wide events (uid None) are not limited."""

    LINES_BURST = 200
    LINES_PER_SECOND = 20.0

    def __init__(self, exempt: Callable[[int], bool]):
        self.exempt = exempt
        self._tokens: dict[int, tuple[float, float]] = {}   # uid: (tokens, when counted)
        self.suppressed: dict[int, int] = {}

    def take(self, uid: int | None, now: float | None = None) -> bool:
        """Whether a line for `uid` may be written now."""
        if uid is None or self.exempt(uid):
            return True
        now = time.monotonic() if now is None else now
        tokens, then = self._tokens.get(uid, (float(self.LINES_BURST), now))
        tokens = min(float(self.LINES_BURST), tokens + (now - then) * self.LINES_PER_SECOND)
        if tokens < 1:
            self._tokens[uid] = (tokens, now)
            self.suppressed[uid] = self.suppressed.get(uid, 0) + 1
            return False
        self._tokens[uid] = (tokens - 1, now)
        if len(self._tokens) > 4096:           # forget the users that are quiet again
            self._tokens = {u: t for u, t in self._tokens.items()
                            if t[0] < self.LINES_BURST - 1}
        return True

    def left_out(self, uid: int | None) -> int:
        """Lines of `uid` not written since the last one that was (and forget them)."""
        return 0 if uid is None else self.suppressed.pop(uid, 0)
