"""`gpumemctl snapshot create` (docs/snapshots.md): which allocations, and a new snapshot of
them in a store. Each is read under a read handle and written as it is read (striping.py);
with --incremental, only the blocks the daemon's change tracking names since the newest
snapshot in the store, the rest referring to that snapshot's data. A `lost` allocation's
entry is carried over from the newest trusted snapshot holding it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable

from ..protocol import (
    Busy,
    InvalidState,
    NotFound,
    PermissionDenied,
    UsageError,
)
from . import devpath, gds, gpuhash
from . import manifest as fmt
from .blocks import Progress, Readers, big_chunks, gather, hash_jobs, noop
from .bycopy import AsleepHandle
from .catalog import Sources, split_location
from .manifest import BLOCK
from .stores import open_store
from .striping import Writing, device_to_file, extents
from .trust import Trust


def select(client, names: list[str]) -> tuple[list[dict], list[dict]]:
    """Allocation entries to snapshot, once each (hard links by id), and what was passed
    over. No names: every durable allocation the caller can see."""
    if not names:
        entries = [e for e in client.walk("")
                   if e["type"] == "allocation" and e.get("durable")]
    else:
        entries = []
        for name in names:
            node = client.info(name)
            if node["type"] == "directory":
                entries += [e for e in client.walk(node["path"])
                            if e["type"] == "allocation"]
            elif node["type"] == "allocation":
                entries.append(node)
            else:
                raise UsageError(f"'{name}' is a {node['type']}: a snapshot holds "
                                 "allocations (name them or their directories)")
    chosen: dict[int, dict] = {}
    for e in entries:
        first = chosen.setdefault(e["id"], {**e, "names": [e["path"]]})
        if first is not e and e["path"] not in first["names"]:
            first["names"].append(e["path"])
    return list(chosen.values()), []


def _base_entry(base: dict | None, path: str, size: int) -> dict | None:
    """For an incremental snapshot: the previous snapshot's entry for the allocation at
    `path`, if it had the same size (else nothing of it is reused)."""
    if base is None:
        return None
    for entry in base["allocations"]:
        if entry["path"] == path and entry["size"] == size:
            return entry
    return None


def _changed_runs(handle, prior: dict | None, nblocks: int) -> tuple[list, str | None]:
    """The block runs to read: from the daemon's change tracking when it still counts from
    the previous snapshot of this allocation (same token), else all of them. Asked under
    the read handle, so no writer comes between the answer and the read."""
    if handle.id is None:                    # read by copy (bycopy.py): no tracking
        return ([(0, nblocks)] if nblocks else []), None
    track = handle.client.call("changes", handle=handle.id, reset=True)
    if prior is not None and track.get("blocks") is not None and \
            track.get("token") is not None and prior.get("track") == track["token"]:
        return [(a, min(b, nblocks)) for a, b in track["blocks"] if a < nblocks], track["next"]
    return [(0, nblocks)] if nblocks else [], track.get("next")


def _snapshot_one(handle, entry: dict, store, name: str, index: int, base: dict | None,
                  trust: Trust, advance: Callable[[int], None]) -> dict:
    info = handle.info
    big_chunks(handle.memory)
    size = info["size"] or 0
    nblocks = fmt.block_count(size)
    data = Writing(store, name, index)
    prior = _base_entry(base, entry["path"], size)
    if prior is not None and _objects_problem(store, prior, trust):
        prior = None                # its data is not all trusted: this one is copied whole
    runs, token = _changed_runs(handle, prior, nblocks)
    blocks: list = [None] * nblocks
    places: list = [None] * nblocks          # per block: (object key, byte offset)
    if prior is not None:                    # what is not read again stays as it was
        blocks[:] = prior["blocks"]
        for b, key, off, _n in fmt.extent_blocks(prior):
            places[b] = (key, off)

    def sink(at: int, view: memoryview) -> None:
        first = at // BLOCK
        hashing = hash_jobs(view)
        if prior is None:
            wrote = data.write(view)         # meanwhile the checksums are computed
            sums = gather(hashing)
            places[first:first + len(sums)] = wrote
        else:
            sums = gather(hashing)
            for k, h in enumerate(sums):
                if blocks[first + k] != h:
                    places[first + k] = data.write(view[k * BLOCK:(k + 1) * BLOCK])[0]
        blocks[first:first + len(sums)] = sums
        advance(len(view))

    kvikio = prior is None and gds.use_kvikio(handle.memory, store)
    hasher = gpuhash.for_memory(handle.memory)
    try:
        if kvikio:
            device_to_file(handle.memory, size, data, blocks, places, advance, hasher)
        elif hasher is not None and prior is None:
            devpath.create_full(handle.memory, size, data, hasher, blocks, places, advance)
        elif hasher is not None:
            devpath.create_changed(handle.memory, size, runs, data, hasher, blocks, places,
                                   advance)
        else:
            for a, b in runs:
                handle.memory.drain(a * BLOCK, min(b * BLOCK, size) - a * BLOCK, sink)
        data.commit()
    except BaseException:
        data.abort()
        raise
    advance(size - sum(min(b * BLOCK, size) - a * BLOCK for a, b in runs))
    return {
        "path": entry["path"], "names": entry["names"][1:], "id": info["id"],
        "size": size, "capacity": info.get("capacity"), "mode": int(info["mode"], 8),
        "uid": info["uid"], "gid": info["gid"], "durable": bool(info.get("durable")),
        "ecc": info.get("ecc") or "none", "device": info.get("device"),
        "unsealed": bool(info.get("unsealed")), "modified": info.get("modified"),
        "metadata": _metadata_of(handle, info), "track": token,
        "blocks": blocks, "extents": extents(places),
        "written": data.written, "read": sum(min(b * BLOCK, size) - a * BLOCK
                                             for a, b in runs),
        "kvikio": kvikio, "hash": "gpu" if hasher is not None else "cpu",
    }


def _metadata_of(handle, info: dict) -> dict:
    """The allocation's user metadata (issue 17), asked for under the read handle: `open`'s
    answer does not carry it."""
    if info.get("metadata") is not None:
        return info["metadata"]
    return handle.client.meta(info["path"])


def create(client, location: str, names: list[str], *, incremental: bool = False,
           progress: Progress = noop, backend: str = "host",
           trust_uids: frozenset[int] = frozenset()) -> dict:
    """Snapshot the allocations into a new snapshot in the store at `location`.

    An allocation that is `lost` has no memory to copy: its entry in the newest trusted
    complete snapshot of the store that holds it (same path, owner and size) is carried
    over, referring to the data there, so the new snapshot still holds it (a snapshot taken
    after a reboot must never become the newest one without what the reboot lost). One that
    no snapshot there holds is skipped and named."""
    store_loc, named = split_location(location)
    if named:
        raise UsageError(f"{location} names a snapshot; `snapshot create` takes the store "
                         f"it goes in ({store_loc})")
    with open_store(store_loc, create=True) as store:
        entries, _ = select(client, names)
        sources = Sources(store, Trust(frozenset(trust_uids)))
        newest = sources.newest()
        base = newest[1] if incremental and newest else None
        name = fmt.new_name()
        started = time.monotonic()
        store.begin(name)
        try:
            store.put_atomic(f"{name}/{fmt.LOCK}", json.dumps(
                {"host": socket.gethostname(), "pid": os.getpid(),
                 "started_ns": time.time_ns(), "uid": os.getuid()}).encode())
            allocations, skipped = _copy_all(client, entries, bool(names), store, name, base,
                                             sources, progress)
            if store.kind == "dir":
                store.sync_dir(f"{name}/data")
            written = sum(a.pop("written") for a in allocations)
            read = sum(a.pop("read") for a in allocations)
            used_kvikio = any([a.pop("kvikio") for a in allocations])
            hashed = {a.pop("hash") for a in allocations}
            builds_on = base is not None or any(a.get("carried") for a in allocations)
            manifest = {
                "format": fmt.FORMAT, "version": fmt.VERSION, "name": name,
                "created_ns": time.time_ns(), "host": socket.gethostname(),
                "uid": os.getuid(), "backend": backend, "block_size": BLOCK,
                "hash": fmt.HASH, "parent": newest[0] if newest and builds_on else None,
                "allocations": allocations,
                "bytes": sum(a["size"] for a in allocations), "bytes_written": written,
            }
            store.put_atomic(f"{name}/{fmt.MANIFEST}", fmt.seal(manifest))
            store.confirm(name)
        except BaseException:
            _discard(store, name)   # a refusal or error leaves nothing behind (kill -9 can)
            raise
        store.delete(f"{name}/{fmt.LOCK}")
        where = store.where(name)
    seconds = time.monotonic() - started
    return {"snapshot": name, "location": where, "store": store_loc,
            "incremental": base is not None, "parent": manifest["parent"],
            "io": gds.io_kind(store, used_kvikio), "checksums": gpuhash.hash_path(hashed),
            "allocations": [_brief(a) for a in allocations], "skipped": skipped,
            "passed_over": sources.passed,
            "bytes": manifest["bytes"], "bytes_written": written, "bytes_read": read,
            "seconds": round(seconds, 6),
            "rate": int(manifest["bytes"] / seconds) if seconds > 0 else None}


def _copy_all(client, entries: list[dict], named: bool, store, name: str,
              base: dict | None, sources: Sources, progress: Progress):
    total = sum(e.get("size") or 0 for e in entries)
    done = 0
    allocations: list[dict] = []
    skipped: list[dict] = []
    for index, entry in enumerate(entries):
        if entry.get("state") == "lost":
            carried, why = _carry(sources, entry, store)
            if carried is not None:
                allocations.append(carried)
            else:
                skipped.append({"path": entry["path"], "reason": "lost", "message": why})
            total -= entry.get("size") or 0
            continue
        try:
            handle = _open(client, entry["path"])
        except (Busy, PermissionDenied, InvalidState, NotFound) as exc:
            if named and isinstance(exc, PermissionDenied):
                raise
            skipped.append({"path": entry["path"], "reason": exc.name, "message": str(exc)})
            total -= entry.get("size") or 0
            continue

        def advance(n: int, path=entry["path"], total=total) -> None:
            nonlocal done
            done += n
            progress(done, total, path)

        try:
            with handle:
                one = _snapshot_one(handle, entry, store, name, index, base, sources.trust,
                                    advance)
        except (InvalidState, NotFound) as exc:   # an asleep one that changed meanwhile
            if not isinstance(handle, AsleepHandle):
                raise
            skipped.append({"path": entry["path"], "reason": exc.name, "message": str(exc)})
            continue
        allocations.append(one)
    return allocations, skipped


def _open(client, path: str):
    """A read handle; for an asleep allocation (no device memory: no fd), a read by copy
    (bycopy.py)."""
    try:
        return client.open(path, "r")
    except InvalidState as exc:
        if exc.details.get("by_copy") and exc.details.get("errno") == "EAGAIN":
            return AsleepHandle(client, path)
        raise


def _carry(sources: Sources, entry: dict, store) -> tuple[dict | None, str]:
    """A lost allocation's entry in the newest trusted snapshot holding its path, carried
    into the new one if it was recorded with the same owner and size and all its data is
    trusted; else None and why."""
    path = entry["path"]
    for snapshot, manifest in sources.each():
        for old in manifest["allocations"]:
            if old["path"] != path:
                continue
            if old["size"] != (entry.get("size") or 0) or old["uid"] != entry.get("uid"):
                return None, (f"'{path}' is lost, and {snapshot}, the newest snapshot here "
                              "holding that name, recorded another owner or size")
            problem = _objects_problem(store, old, sources.trust)
            if problem:
                return None, f"'{path}' is lost, and its copy in {snapshot}: {problem}"
            return {**old, "carried": True, "track": None, "written": 0, "read": 0,
                    "kvikio": False, "hash": None}, ""
    return None, f"'{path}' is lost and no snapshot in this store holds it"


def _objects_problem(store, entry: dict, trust: Trust) -> str | None:
    """Why the data objects an entry refers to are not to be built on (someone else's),
    or None. An object store has no owners to check."""
    if store.kind != "dir":
        return None
    readers = Readers(store, trust)
    try:
        readers.check(entry)
    except PermissionDenied as exc:
        return str(exc)
    finally:
        readers.close()
    return None


def _discard(store, name: str) -> None:
    """Remove what a create that failed had written of its snapshot."""
    try:
        for key in store.keys(name):
            store.delete(key)
        store.finish_removal(name)
    except Exception:  # noqa: BLE001 - the original error is the one to report
        pass


def _brief(a: dict) -> dict:
    return {"path": a["path"], "size": a["size"], "durable": a["durable"],
            "unsealed": a["unsealed"], "blocks": len(a["blocks"]),
            "carried": bool(a.get("carried"))}
