"""`gpumemctl snapshot verify|ls|rm` (docs/snapshots.md): what a store holds, whether it is
whole, and removing what is no longer wanted without removing what a kept snapshot needs.

Every command reads the store through descriptors (dirfd.py): a symlink, FIFO or device
planted where a snapshot's directory or file should be is named, never followed or read.
Whose snapshots count is trust.py's rule: `verify` checks those the caller trusts and names
the others; `ls` lists every one, marking those a restore passes over `untrusted`; `rm
--keep N` keeps the newest N complete ones the caller trusts, removes the caller's other
ones and leaves everyone else's alone (`rm STORE/snap-...` removes the one named, whoever's).
"""
from __future__ import annotations

import json
import os
import socket

from ..protocol import NotFound, PermissionDenied, UsageError
from . import manifest as fmt
from .blocks import CHUNK, Progress, Readers, fill_chunk, noop, places_of
from .catalog import load_manifest, split_location
from .manifest import SnapshotDamaged
from .stores import open_store
from .trust import Trust, Untrusted


# ---- verify -----------------------------------------------------------------------------
def verify(location: str, progress: Progress = noop,
           trust_uids: frozenset[int] = frozenset()) -> dict:
    """Check manifests and every block of every snapshot named (one, or all in a store)
    that the caller trusts; the others are reported `untrusted` and not read."""
    store_loc, named = split_location(location)
    trust = Trust(frozenset(trust_uids))
    with open_store(store_loc) as store:
        names = [named] if named else store.names()
        report = [_verify_one(store, name, trust, progress) for name in names]
    return {"location": location, "snapshots": report,
            "damaged": sum(1 for r in report if r["result"] == "damaged"),
            "untrusted": sum(1 for r in report if r["result"] == "untrusted")}


def _verify_one(store, name: str, trust: Trust, progress: Progress) -> dict:
    try:
        manifest = load_manifest(store, name, trust)
    except NotFound:
        retired = store.exists(f"{name}/{fmt.RETIRED}")
        return {"snapshot": name, "result": "retired" if retired else "partial",
                "problems": []}
    except PermissionDenied as exc:          # someone else's (Untrusted), or unreadable
        return {"snapshot": name, "result": "untrusted", "problems": [{"message": str(exc)}]}
    except SnapshotDamaged as exc:
        return {"snapshot": name, "result": "damaged", "problems": [{"message": str(exc)}]}
    readers = Readers(store, trust)
    problems = []
    total = sum(e["size"] for e in manifest["allocations"])
    done = 0
    buf = bytearray(CHUNK)
    try:
        for entry in manifest["allocations"]:
            try:
                readers.check(entry)
            except PermissionDenied as exc:
                return {"snapshot": name, "result": "untrusted",
                        "problems": [{"path": entry["path"], "message": str(exc)}]}
            places = places_of(entry)
            bad: list[int] = []
            size = entry["size"]
            for at in range(0, size, len(buf)):
                view = memoryview(buf)[:min(len(buf), size - at)]
                fill_chunk(at, view, entry, places, readers, bad)
                done += len(view)
                progress(done, total, f"{name} {entry['path']}")
            if bad:
                problems.append({"path": entry["path"], "ranges": fmt.ranges_of(bad, size),
                                 "message": f"{len(bad)} block(s) of '{entry['path']}' fail "
                                            "their checksum or are missing"})
    finally:
        readers.close()
    return {"snapshot": name, "result": "damaged" if problems else "ok",
            "problems": problems, "allocations": len(manifest["allocations"]),
            "bytes": total}


# ---- ls ---------------------------------------------------------------------------------
def list_snapshots(location: str, trust_uids: frozenset[int] = frozenset()) -> list[dict]:
    store_loc, named = split_location(location)
    trust = Trust(frozenset(trust_uids))
    with open_store(store_loc) as store:
        return [describe(store, name, trust) for name in ([named] if named else store.names())]


def list_allocations(location: str,
                     trust_uids: frozenset[int] = frozenset()) -> tuple[list[dict], str | None]:
    """`snapshot ls STORE/snap-...`: what one snapshot holds, one row per allocation, and
    why a restore would pass the snapshot over (None: it would not). A partial or retired
    one holds nothing to list (NotFound, exit 4), a damaged one is named (exit 8)."""
    store_loc, named = split_location(location)
    if named is None:
        raise UsageError(f"{location} is a store, not one snapshot in it")
    trust = Trust(frozenset(trust_uids))
    distrust = None
    with open_store(store_loc) as store:
        if named not in store.names():
            raise NotFound(f"no snapshot {location}")
        try:
            try:
                manifest = load_manifest(store, named, trust)
            except Untrusted as exc:          # listed all the same: reading is not trusting
                distrust = str(exc)
                manifest = load_manifest(store, named)
        except NotFound:
            if store.exists(f"{named}/{fmt.RETIRED}"):
                raise NotFound(f"snapshot {location} was removed (retired: newer snapshots "
                               "use its data); it holds no allocation") from None
            raise
    return [_held(named, entry) for entry in manifest["allocations"]], distrust


def _held(name: str, entry: dict) -> dict:
    """One allocation of a snapshot as `ls` shows it (fields checked by manifest.parse).
    `state`: `unsealed` (copied while an attached writer had not sealed it: restored so),
    `carried` (lost when the snapshot was made: its entry and data are an older one's),
    else `ok`. `blocks_here`: the blocks whose bytes this snapshot stored itself."""
    own = sum(count for _first, count, key, _off in entry["extents"]
              if fmt.snapshot_of_key(key) == name)
    state = "unsealed" if entry.get("unsealed") is True else \
        "carried" if entry.get("carried") is True else "ok"
    return {"path": entry["path"], "names": list(entry.get("names") or []),
            "size": entry["size"], "blocks": len(entry["blocks"]), "blocks_here": own,
            "state": state, "modified": entry.get("modified"),
            "mode": f"{entry['mode'] & 0o7777:04o}", "uid": entry["uid"],
            "gid": entry["gid"], "durable": entry["durable"], "ecc": entry["ecc"]}


def describe(store, name: str, trust: Trust) -> dict:
    """A snapshot as `ls` shows it: its state (complete, untrusted, partial, in progress,
    damaged, retired), its owner, and whether the caller trusts it (`trusted`; else
    `distrust` says why). One the caller does not trust is still described."""
    row: dict = {"snapshot": name, "location": store.where(name), "owner": store.owner(name),
                 "trusted": True}
    try:
        try:
            m = load_manifest(store, name, trust)
        except Untrusted as exc:
            row.update(trusted=False, distrust=str(exc))
            m = load_manifest(store, name)
    except NotFound:
        if store.exists(f"{name}/{fmt.RETIRED}"):
            row.update(state="retired")       # removed; newer snapshots still use its data
        else:
            row.update(state="in progress" if _writer_alive(_lock(store, name)) else "partial")
        return row
    except PermissionDenied as exc:              # not the caller's to read, nor to remove
        row.update(state="damaged", message=str(exc), trusted=False, distrust=str(exc))
        return row
    except SnapshotDamaged as exc:
        row.update(state="damaged", message=str(exc))
        return row
    row.update(state="complete" if row["trusted"] else "untrusted",
               created_ns=m["created_ns"], parent=m["parent"],
               allocations=len(m["allocations"]), bytes=m["bytes"],
               bytes_written=m["bytes_written"], host=m.get("host"))
    return row


def _lock(store, name: str) -> bytes | None:
    try:
        return store.read(f"{name}/{fmt.LOCK}", 4096)
    except (SnapshotDamaged, PermissionDenied):
        return None


def _writer_alive(lock: bytes | None) -> bool:
    """A partial snapshot still being written: by a live process on this host."""
    if not lock:
        return False
    try:
        info = json.loads(lock)
        if info.get("host") != socket.gethostname():
            return True           # cannot tell: another host's; treat as in progress
        os.kill(int(info["pid"]), 0)
        return True
    except ProcessLookupError:
        return False
    except (ValueError, KeyError, TypeError, PermissionError):
        return True



# ---- rm ---------------------------------------------------------------------------------
def remove(location: str, keep: int | None, trust_uids: frozenset[int] = frozenset()) -> dict:
    """`snapshot rm`: one named snapshot, or all but the newest `keep` complete ones the
    caller trusts, and every partial one of the caller's no longer being written; never
    fewer than min(keep, count) complete ones, never data a kept snapshot refers to, never
    another user's snapshot (those are left alone, and named)."""
    store_loc, named = split_location(location)
    trust = Trust(frozenset(trust_uids))
    with open_store(store_loc) as store:
        names = store.names()
        left_alone: list[dict] = []
        if named:
            if named not in names:
                raise NotFound(f"no snapshot {location}")
            doomed = [named]
        elif keep is None:
            raise UsageError(f"{location} holds {len(names)} snapshot(s): name one "
                             f"({store_loc.rstrip('/')}/snap-...) or give --keep N")
        else:
            doomed, left_alone = _doomed(store, names, keep, trust)
        survivors = [n for n in names if n not in doomed]
        referenced, unreadable = _references(store, survivors, trust)
        removed, kept_objects = [], 0
        for n in doomed:
            kept_objects += _remove_one(store, n, referenced, unreadable)
            removed.append(n)
    return {"location": location, "removed": removed, "kept": survivors,
            "left_alone": left_alone, "objects_kept_for_newer": kept_objects}


def _doomed(store, names: list[str], keep: int, trust: Trust) -> tuple[list[str], list[dict]]:
    """What `--keep N` removes, and the snapshots it leaves alone as others'."""
    rows = {n: describe(store, n, trust) for n in names}
    complete = [n for n in names if rows[n]["state"] == "complete"]
    kept = set(complete[max(0, len(complete) - keep):]) if keep > 0 else set()
    doomed = [n for n in names if n not in kept and rows[n]["trusted"]
              and rows[n]["state"] != "in progress"]
    others = [{"snapshot": n, "owner": rows[n]["owner"], "message": rows[n]["distrust"]}
              for n in names if not rows[n]["trusted"]]
    return doomed, others


def _references(store, survivors: list[str], trust: Trust) -> tuple[set[str], bool]:
    """Every data object a surviving manifest refers to (someone else's too: a snapshot
    may build on another's), and whether a survivor of the caller's could not be read (then
    it may refer to anything: no data object is removed)."""
    referenced: set[str] = set()
    unreadable = False
    for n in survivors:
        try:
            referenced |= fmt.keys_of(load_manifest(store, n, trust))
        except NotFound:
            pass                # partial or retired: no manifest refers to anything
        except Untrusted:
            try:
                referenced |= fmt.keys_of(load_manifest(store, n))
            except (NotFound, SnapshotDamaged, PermissionDenied):
                pass            # someone else's that cannot be read: nothing to rely on
        except (SnapshotDamaged, PermissionDenied):
            unreadable = True
    return referenced, unreadable


def _remove_one(store, n: str, referenced: set[str], unreadable: bool) -> int:
    """Remove a snapshot, keeping (as `retired`) the objects newer ones use; their count."""
    kept_here = {key for key in store.keys(n) if key in referenced or
                 (unreadable and "/data/" in key)}
    if kept_here:
        store.put_atomic(f"{n}/{fmt.RETIRED}", b"{}")
    store.delete(f"{n}/{fmt.MANIFEST}")        # first: it stops being a snapshot
    for key in store.keys(n):
        if key not in kept_here and not key.endswith(fmt.RETIRED):
            store.delete(key)
    if not kept_here:
        store.delete(f"{n}/{fmt.RETIRED}")
    store.finish_removal(n)
    return len(kept_here)
