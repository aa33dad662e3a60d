"""Snapshots taken and restored by a client: `gpumemctl snapshot ...` (docs/snapshots.md).

The data moves in the caller's process, with the caller's rights on both sides: gpumemd hands
it each allocation's memory by fd after its usual permission checks (a read handle to take a
snapshot, a `refill` handle to restore one), and the store is opened with the caller's own
file-system or S3 credentials. The daemon never opens a path a client names.

Consistency: an allocation is read under a read handle, and the daemon's one-writer rule keeps
every writer out while it is held, so each allocation's data in a snapshot is one moment's.
An `unsealed` allocation (an attached writer ended without seal) has no writer to wait for:
it is copied as it is, and the manifest and the restored allocation say `unsealed`.

Crash safety: data objects are written and fsynced first, the manifest last by an atomic
rename (or one PUT), so a snapshot exists whole or not at all; a `lock.json` marks one being
written, and one without a manifest is `partial` to `snapshot ls` and removable by
`snapshot rm`. A restore refills each allocation through a handle in state `restoring`:
until the daemon hears it completed, the allocation is not served, and a restore that dies
leaves it `lost`, never half-filled and `ready`.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..protocol import (
    Busy,
    Exists,
    GpumemError,
    InvalidState,
    NotFound,
    PermissionDenied,
    UsageError,
)
from . import gds
from . import manifest as fmt
from .manifest import BLOCK, SnapshotDamaged
from .stores import io_pool, open_store

Progress = Callable[[int, int, str], None]     # (bytes done, bytes total, detail)
HASH_GROUP = 8                                   # blocks per checksum task
CHUNK = 256 << 20          # bytes a snapshot moves at a time (a pinned buffer's, on cuda)


def _noop(done: int, total: int, detail: str = "") -> None:
    pass


# ---- naming a store or one snapshot in it ---------------------------------------------------
def split_location(location: str) -> tuple[str, str | None]:
    """`DEST` or `DEST/snap-...`: the store's location and the snapshot named, if any."""
    fmt.check_location(location)
    head, _, last = location.rstrip("/").rpartition("/")
    if fmt.NAME_RE.fullmatch(last):
        return (head or "."), last
    return location, None


def load_manifest(store, name: str) -> dict:
    raw = store.read(f"{name}/{fmt.MANIFEST}", fmt.MAX_MANIFEST)
    if raw is None:
        raise NotFound(f"snapshot {store.where(name)} has no manifest: it is partial (its "
                       "creation did not finish); `gpumemctl snapshot rm` removes it")
    if len(raw) > fmt.MAX_MANIFEST:
        raise SnapshotDamaged(f"{store.where(name)}: the manifest is larger than "
                              f"{fmt.MAX_MANIFEST} bytes")
    manifest = fmt.parse(raw, store.where(f"{name}/{fmt.MANIFEST}"))
    if manifest["name"] != name:
        raise SnapshotDamaged(f"{store.where(name)}: its manifest names another snapshot "
                              f"({manifest['name']})")
    return manifest


def newest_complete(store) -> str | None:
    for name in reversed(store.names()):
        if store.read(f"{name}/{fmt.MANIFEST}", 0) is not None:
            return name
    return None


# ---- which allocations ------------------------------------------------------------------
def select(client, names: list[str]) -> tuple[list[dict], list[dict]]:
    """Allocation entries to snapshot, once each (hard links by id), and what was passed
    over. No names: every durable allocation the caller can see."""
    if not names:
        entries = [e for e in client.ls("", recursive=True)
                   if e["type"] == "allocation" and e.get("durable")]
    else:
        entries = []
        for name in names:
            node = client.info(name)
            if node["type"] == "directory":
                entries += [e for e in client.ls(node["path"], recursive=True)
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


# ---- create -----------------------------------------------------------------------------
STRIPES = 16               # data objects per allocation in a directory store
UNIT = 8                   # blocks per stripe unit (8 MiB)


class _Writing:
    """One allocation's data, written as blocks go by. In a directory store it is striped
    over STRIPES objects in 8 MiB units, so that parallel writes go to different files (a
    file system serialises writes to one file: tmpfs's 2 GB/s against the 27 GB/s of 16
    files at once on the GPU machine); an object store gets one object (its multipart
    upload is parallel already). Objects are opened at their first block."""

    def __init__(self, store, name: str, index: int):
        self.store = store
        self.stripes = STRIPES if store.kind == "dir" else 1
        self.keys = [fmt.data_key(name, index * STRIPES + k) for k in range(self.stripes)]
        self.key = self.keys[0]
        self.writers: dict[int, Any] = {}
        self.blocks = 0             # blocks written so far (their order in the stripes)
        self.written = 0            # bytes written so far

    def _writer(self, k: int):
        if k not in self.writers:
            self.writers[k] = self.store.writer(self.keys[k])
        return self.writers[k]

    def _place(self, lb: int) -> tuple[int, int]:
        unit = lb // UNIT
        return unit % self.stripes, (unit // self.stripes) * UNIT * BLOCK + lb % UNIT * BLOCK

    def write(self, view: memoryview) -> list[tuple[str, int]]:
        """Write whole blocks (the last may be short); where each block went."""
        n = fmt.block_count(len(view))
        places = [self._place(self.blocks + k) for k in range(n)]
        if self.stripes == 1:
            self._writer(0).write(view)
        else:
            jobs = []
            k = 0
            while k < n:                       # runs of blocks in one stripe unit
                end = min(n, k + UNIT - (self.blocks + k) % UNIT)
                stripe, off = places[k]
                piece = view[k * BLOCK:min(end * BLOCK, len(view))]
                jobs.append(io_pool().submit(self._writer(stripe).write_at, off, piece))
                k = end
            for job in jobs:
                job.result()
        self.blocks += n
        self.written += len(view)
        return [(self.keys[stripe], off) for stripe, off in places]

    def write_device(self, memory, at: int, n: int) -> int:
        """`n` bytes of GPU memory at offset `at`, by KvikIO (gds.py), to the first object."""
        if 0 not in self.writers:
            self.writers[0] = gds.DeviceWriter(self.store.local_path(self.key),
                                               memory.device)
        off = self.writers[0].write_device(memory.ptr + at, n)
        self.written += n
        return off

    def commit(self) -> None:
        for w in self.writers.values():
            w.commit()

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


def _hash_jobs(view: memoryview) -> list:
    """Futures of the checksums of `view`'s blocks, HASH_GROUP blocks a task."""
    n = fmt.block_count(len(view))

    def run(g: int) -> list[str]:
        return [fmt.block_hash(view[b * BLOCK:(b + 1) * BLOCK])
                for b in range(g, min(g + HASH_GROUP, n))]
    return [io_pool().submit(run, g) for g in range(0, n, HASH_GROUP)]


def _gather(jobs: list) -> list[str]:
    out: list[str] = []
    for job in jobs:
        out += job.result()
    return out


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
    track = handle.client.call("changes", handle=handle.id, reset=True)
    if prior is not None and track.get("blocks") is not None and \
            track.get("token") is not None and prior.get("track") == track["token"]:
        return [(a, min(b, nblocks)) for a, b in track["blocks"] if a < nblocks], track["next"]
    return [(0, nblocks)] if nblocks else [], track.get("next")


def _big_chunks(memory) -> None:
    """Move CHUNK bytes at a time: enough 8 MiB pieces in flight to keep 16 threads busy
    (a cuda handle's staging buffers are made at their first use, this size)."""
    if hasattr(memory, "chunk"):
        memory.chunk = CHUNK


def _snapshot_one(handle, entry: dict, store, name: str, index: int, base: dict | None,
                  advance: Callable[[int], None]) -> dict:
    info = handle.info
    _big_chunks(handle.memory)
    size = info["size"] or 0
    nblocks = fmt.block_count(size)
    data = _Writing(store, name, index)
    prior = _base_entry(base, entry["path"], size)
    runs, token = _changed_runs(handle, prior, nblocks)
    blocks: list = [None] * nblocks
    places: list = [None] * nblocks          # per block: (object key, byte offset)
    if prior is not None:                    # what is not read again stays as it was
        blocks[:] = prior["blocks"]
        for b, key, off, _n in fmt.extent_blocks(prior):
            places[b] = (key, off)

    def sink(at: int, view: memoryview) -> None:
        first = at // BLOCK
        hashing = _hash_jobs(view)
        if prior is None:
            wrote = data.write(view)         # meanwhile the checksums are computed
            sums = _gather(hashing)
            places[first:first + len(sums)] = wrote
        else:
            sums = _gather(hashing)
            for k, h in enumerate(sums):
                if blocks[first + k] != h:
                    places[first + k] = data.write(view[k * BLOCK:(k + 1) * BLOCK])[0]
        blocks[first:first + len(sums)] = sums
        advance(len(view))

    kvikio = prior is None and gds.use_kvikio(handle.memory, store)
    try:
        if kvikio:
            _device_to_file(handle.memory, size, data, blocks, places, advance)
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
        "blocks": blocks, "extents": _extents(places),
        "written": data.written, "read": sum(min(b * BLOCK, size) - a * BLOCK
                                             for a, b in runs),
        "kvikio": kvikio,
    }


def _metadata_of(handle, info: dict) -> dict:
    """The allocation's user metadata (issue 17), asked for under the read handle: `open`'s
    answer does not carry it."""
    if info.get("metadata") is not None:
        return info["metadata"]
    return handle.client.meta(info["path"])


def _device_to_file(memory, size: int, data: _Writing, blocks: list, places: list,
                    advance: Callable[[int], None]) -> None:
    """A full copy of GPU memory by KvikIO, chunk by chunk, while the same chunk's
    checksums are computed from a device-to-host pass through the staging buffers."""
    for at in range(0, size, gds.CHUNK):
        n = min(gds.CHUNK, size - at)
        written = io_pool().submit(data.write_device, memory, at, n)
        first = at // BLOCK

        def hash_sink(where: int, view: memoryview) -> None:
            sums = _gather(_hash_jobs(view))
            b = where // BLOCK
            blocks[b:b + len(sums)] = sums

        try:
            memory.drain(at, n, hash_sink)
        finally:
            off = written.result()
        count = fmt.block_count(n)
        places[first:first + count] = [(data.key, off + k * BLOCK) for k in range(count)]
        advance(n)


def _extents(places: list[tuple[str, int]]) -> list[list]:
    out: list[list] = []
    for b, (key, off) in enumerate(places):
        last = out[-1] if out else None
        if last and last[2] == key and last[3] + last[1] * BLOCK == off:
            last[1] += 1
        else:
            out.append([b, 1, key, off])
    return out


def create(client, location: str, names: list[str], *, incremental: bool = False,
           progress: Progress = _noop, backend: str = "host") -> dict:
    """Snapshot the allocations into a new snapshot in the store at `location`.

    An allocation that is `lost` has no memory to copy: its entry in the newest complete
    snapshot of the store (same path and size) is carried over, referring to the data
    there, so the new snapshot still holds it (a snapshot taken after a reboot must never
    become the newest one without what the reboot lost). One that no snapshot there holds
    is skipped and named."""
    store_loc, named = split_location(location)
    if named:
        raise UsageError(f"{location} names a snapshot; `snapshot create` takes the store "
                         f"it goes in ({store_loc})")
    store = open_store(store_loc, create=True)
    entries, _ = select(client, names)
    newest = newest_complete(store)
    previous = load_manifest(store, newest) if newest else None
    base = previous if incremental else None
    name = fmt.new_name()
    started = time.monotonic()
    store.begin(name)
    try:
        store.put_atomic(f"{name}/{fmt.LOCK}", json.dumps(
            {"host": socket.gethostname(), "pid": os.getpid(), "started_ns": time.time_ns(),
             "uid": os.getuid()}).encode())
        allocations, skipped = _copy_all(client, entries, bool(names), store, name, base,
                                         previous, progress)
        if store.kind == "dir":
            store.sync_dir(f"{name}/data")
        written = sum(a.pop("written") for a in allocations)
        read = sum(a.pop("read") for a in allocations)
        used_kvikio = any([a.pop("kvikio") for a in allocations])
        manifest = {
            "format": fmt.FORMAT, "version": fmt.VERSION, "name": name,
            "created_ns": time.time_ns(), "host": socket.gethostname(), "uid": os.getuid(),
            "backend": backend, "block_size": BLOCK, "hash": fmt.HASH,
            "parent": newest if (base is not None or any(a.get("carried")
                                                          for a in allocations)) else None,
            "allocations": allocations,
            "bytes": sum(a["size"] for a in allocations), "bytes_written": written,
        }
        store.put_atomic(f"{name}/{fmt.MANIFEST}", fmt.seal(manifest))
    except BaseException:
        _discard(store, name)       # a refusal or error leaves nothing behind (kill -9 can)
        raise
    store.delete(f"{name}/{fmt.LOCK}")
    seconds = time.monotonic() - started
    return {"snapshot": name, "location": store.where(name), "store": store_loc,
            "incremental": base is not None, "parent": manifest["parent"],
            "io": _io_kind(store, used_kvikio),
            "allocations": [_brief(a) for a in allocations], "skipped": skipped,
            "bytes": manifest["bytes"], "bytes_written": written, "bytes_read": read,
            "seconds": round(seconds, 6),
            "rate": int(manifest["bytes"] / seconds) if seconds > 0 else None}


def _copy_all(client, entries: list[dict], named: bool, store, name: str,
              base: dict | None, previous: dict | None, progress: Progress):
    total = sum(e.get("size") or 0 for e in entries)
    done = 0
    allocations: list[dict] = []
    skipped: list[dict] = []
    for index, entry in enumerate(entries):
        if entry.get("state") == "lost":
            carried = _carry(previous, entry)
            if carried is not None:
                allocations.append(carried)
            else:
                skipped.append({"path": entry["path"], "reason": "lost",
                                "message": f"'{entry['path']}' is lost and no snapshot in "
                                           "this store holds it"})
            total -= entry.get("size") or 0
            continue
        try:
            handle = client.open(entry["path"], "r")
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

        with handle:
            allocations.append(_snapshot_one(handle, entry, store, name, index, base,
                                             advance))
    return allocations, skipped


def _carry(previous: dict | None, entry: dict) -> dict | None:
    """A lost allocation's entry in the previous snapshot, carried into the new one."""
    if previous is None:
        return None
    for old in previous["allocations"]:
        if old["path"] == entry["path"] and old["size"] == (entry.get("size") or 0):
            return {**old, "carried": True, "track": None, "written": 0, "read": 0,
                    "kvikio": False}
    return None


def _discard(store, name: str) -> None:
    """Remove what a create that failed had written of its snapshot."""
    try:
        for key in store.keys(name):
            store.delete(key)
        store.finish_removal(name)
    except Exception:  # noqa: BLE001 - the original error is the one to report
        pass


def _io_kind(store, kvikio: bool = False) -> str:
    return "s3" if store.kind == "s3" else gds.io_kind(kvikio)


def _brief(a: dict) -> dict:
    return {"path": a["path"], "size": a["size"], "durable": a["durable"],
            "unsealed": a["unsealed"], "blocks": len(a["blocks"]),
            "carried": bool(a.get("carried"))}


# ---- restore ----------------------------------------------------------------------------
class _Readers:
    """The store's data objects a restore or verify reads, each opened once."""

    def __init__(self, store):
        self.store, self.open = store, {}
        self.lock = threading.Lock()

    def get(self, key: str):
        with self.lock:
            if key not in self.open:
                self.open[key] = self.store.reader(key)
            return self.open[key]

    def close(self) -> None:
        for r in self.open.values():
            r.close()


def _fill_chunk(at: int, view: memoryview, entry: dict, places: dict, readers: _Readers,
                bad: list[int]) -> None:
    """Fill `view` (bytes [at, at+len) of the allocation) from the store, checking each
    block; a block that fails is zeroed and listed in `bad`, never left as data. Blocks
    stored one after another (at most a stripe unit) are read in one call, each run with
    its checks a task of its own on the I/O pool."""
    first, n = at // BLOCK, fmt.block_count(len(view))

    def piece(k: int) -> memoryview:
        return view[k * BLOCK:min((k + 1) * BLOCK, len(view))]

    def run(k0: int, k1: int) -> list[int]:
        key, off = places[first + k0]
        failed: set[int] = set()
        try:
            readers.get(key).read_into(off, view[k0 * BLOCK:min(k1 * BLOCK, len(view))])
        except SnapshotDamaged:         # find which blocks of the run are there after all
            for k in range(k0, k1):
                try:
                    readers.get(key).read_into(off + (k - k0) * BLOCK, piece(k))
                except SnapshotDamaged:
                    failed.add(k)
        out = []
        for k in range(k0, k1):
            if k in failed or fmt.block_hash(piece(k)) != entry["blocks"][first + k]:
                piece(k)[:] = bytes(len(piece(k)))
                out.append(first + k)
        return out

    jobs = [io_pool().submit(run, k0, k1) for k0, k1 in _contiguous(first, n, places)]
    for job in jobs:
        bad += job.result()


def _contiguous(first: int, n: int, places: dict) -> list[tuple[int, int]]:
    """Runs [k0, k1) of the blocks first+k whose bytes follow each other in one object."""
    runs: list[tuple[int, int]] = []
    for k in range(n):
        key, off = places[first + k]
        if runs:
            k0, _ = runs[-1]
            key0, off0 = places[first + k0]
            if key0 == key and off0 + (k - k0) * BLOCK == off and k - k0 < UNIT:
                runs[-1] = (k0, k + 1)
                continue
        runs.append((k, k + 1))
    return runs


def _file_to_device(memory, entry: dict, places: dict, store, bad: list[int],
                    advance: Callable[[int], None]) -> None:
    """Restore into GPU memory by KvikIO, then check each block from a device-to-host pass;
    a block that fails is zeroed on the device and listed in `bad`."""
    from .. import cudadrv
    size = entry["size"]
    for at in range(0, size, gds.CHUNK):
        n = min(gds.CHUNK, size - at)
        first = at // BLOCK
        failed: set[int] = set()
        for k0, k1 in _contiguous(first, fmt.block_count(n), places):
            key, off = places[first + k0]
            length = min(k1 * BLOCK, n) - k0 * BLOCK
            try:
                got = gds.read_device(store.local_path(key), memory.device,
                                      memory.ptr + at + k0 * BLOCK, length, off)
            except Exception:  # noqa: BLE001 - a missing or short object: damaged blocks
                got = -1
            if got != length:
                failed.update(range(first + k0, first + k1))
        found: list[int] = []

        def check(where: int, view: memoryview, found=found, failed=failed) -> None:
            b0 = where // BLOCK
            found.extend(b0 + k for k, h in enumerate(_gather(_hash_jobs(view)))
                         if b0 + k in failed or h != entry["blocks"][b0 + k])

        memory.drain(at, n, check)
        with cudadrv.context(memory.device):
            for b in found:
                cudadrv.memset_d8(memory.ptr + b * BLOCK, 0, min(BLOCK, size - b * BLOCK))
            if found:
                cudadrv.ctx_synchronize()
        bad += found
        advance(n)


def _relink(client, target: str, name: str) -> None:
    """Give the restored allocation its further hard-link name, its directory made if
    need be; a name that exists already is left as it is."""
    parent = name.rpartition("/")[0]
    try:
        if parent:
            client.mkdir(parent, parents=True)
    except Exists:
        pass
    try:
        client.link(target, name)
    except Exists:
        pass


def _target(path: str, prefix: str | None) -> str:
    return f"{prefix.strip('/')}/{path}" if prefix else path


def restore(client, location: str, names: list[str], *, as_prefix: str | None = None,
            device: str | None = None, force: bool = False, lost_only: bool = False,
            progress: Progress = _noop) -> dict:
    """Restore the snapshot's allocations (or those under `names`): a missing name is
    created, a `lost` one refilled in place, an existing one refused unless `force`.
    `lost_only`: refill lost allocations only, create nothing (restore_on_start)."""
    store_loc, named = split_location(location)
    store = open_store(store_loc)
    name = named or newest_complete(store)
    if name is None:
        raise NotFound(f"{location} holds no complete snapshot")
    manifest = load_manifest(store, name)
    entries = _restore_selection(manifest, names)
    if lost_only:
        entries = [e for e in entries if _is_lost(client, _target(e["path"], as_prefix))]
    total = sum(e["size"] for e in entries)
    done, started = 0, time.monotonic()
    results: list[dict] = []
    failures: list[GpumemError] = []
    readers = _Readers(store)
    try:
        for entry in entries:
            target = _target(entry["path"], as_prefix)
            def advance(n: int, base: int = done, t: str = target) -> None:
                progress(base + n, total, t)

            try:
                result = _restore_one(client, entry, target, device, force, readers, advance)
            except GpumemError as exc:
                failures.append(exc)
                results.append({"path": target, "from": entry["path"], "result": exc.name,
                                "message": str(exc)})
            else:
                results.append(result)
            done += entry["size"]
    finally:
        readers.close()
    seconds = time.monotonic() - started
    damaged = [r for r in results if r.get("damaged")]
    return {"snapshot": name, "location": store.where(name),
            "io": _io_kind(store, any(r.get("kvikio") for r in results)),
            "allocations": results, "damaged": len(damaged), "failed": len(failures),
            "bytes": total, "seconds": round(seconds, 6),
            "rate": int(total / seconds) if seconds > 0 else None,
            "_failures": failures}


def _is_lost(client, path: str) -> bool:
    try:
        return client.info(path).get("state") == "lost"
    except (NotFound, PermissionDenied):
        return False


def _restore_selection(manifest: dict, names: list[str]) -> list[dict]:
    entries = manifest["allocations"]
    if not names:
        return entries
    picked = []
    for name in names:
        name = name.strip("/")
        hits = [e for e in entries if e["path"] == name or e["path"].startswith(name + "/")]
        if not hits:
            raise NotFound(f"snapshot {manifest['name']} holds no allocation '{name}'")
        picked += [e for e in hits if e not in picked]
    return picked


def _restore_one(client, entry: dict, target: str, device: str | None, force: bool,
                 readers: _Readers, advance: Callable[[int], None]) -> dict:
    places = {b: (key, off) for b, key, off, _n in fmt.extent_blocks(entry)}
    # The user metadata comes back with the allocation (issue 17; the daemon checks it).
    metadata = entry.get("metadata")
    handle = client.refill(target, size=entry["size"], mode=entry["mode"], ecc=entry["ecc"],
                           durable=entry["durable"], device=device, force=force,
                           unsealed=entry.get("unsealed", False),
                           metadata=metadata if isinstance(metadata, dict) else None)
    bad: list[int] = []
    moved = 0

    def source(at: int, view: memoryview) -> None:
        nonlocal moved
        _fill_chunk(at, view, entry, places, readers, bad)
        moved += len(view)
        advance(moved)

    kvikio = gds.use_kvikio(handle.memory, readers.store)
    _big_chunks(handle.memory)
    with handle:
        if kvikio:
            _file_to_device(handle.memory, entry, places, readers.store, bad, advance)
        else:
            handle.memory.fill(0, entry["size"], source)
        ranges = fmt.ranges_of(bad, entry["size"])
        handle.restored = {"damaged": ranges}
    prefix = target[:len(target) - len(entry["path"])]
    for extra in entry.get("names") or []:
        _relink(client, target, f"{prefix}{extra}")
    return {"path": target, "from": entry["path"], "size": entry["size"],
            "result": "degraded" if ranges else "ok", "damaged": ranges, "kvikio": kvikio}


# ---- verify, ls, rm ---------------------------------------------------------------------
def verify(location: str, progress: Progress = _noop) -> dict:
    """Check manifests and every block of every snapshot named (one, or all in a store)."""
    store_loc, named = split_location(location)
    store = open_store(store_loc)
    names = [named] if named else store.names()
    report = []
    for name in names:
        report.append(_verify_one(store, name, progress))
    bad = [r for r in report if r["result"] == "damaged"]
    return {"location": location, "snapshots": report, "damaged": len(bad)}


def _verify_one(store, name: str, progress: Progress) -> dict:
    try:
        manifest = load_manifest(store, name)
    except NotFound:
        retired = store.read(f"{name}/{fmt.RETIRED}", 0) is not None
        return {"snapshot": name, "result": "retired" if retired else "partial",
                "problems": []}
    except SnapshotDamaged as exc:
        return {"snapshot": name, "result": "damaged", "problems": [{"message": str(exc)}]}
    readers = _Readers(store)
    problems = []
    total = sum(e["size"] for e in manifest["allocations"])
    done = 0
    buf = bytearray(CHUNK)
    try:
        for entry in manifest["allocations"]:
            places = {b: (key, off) for b, key, off, _n in fmt.extent_blocks(entry)}
            bad: list[int] = []
            size = entry["size"]
            for at in range(0, size, len(buf)):
                view = memoryview(buf)[:min(len(buf), size - at)]
                _fill_chunk(at, view, entry, places, readers, bad)
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


def list_snapshots(location: str) -> list[dict]:
    store_loc, named = split_location(location)
    store = open_store(store_loc)
    out = []
    for name in ([named] if named else store.names()):
        out.append(_describe(store, name))
    return out


def _describe(store, name: str) -> dict:
    row: dict = {"snapshot": name, "location": store.where(name)}
    try:
        m = load_manifest(store, name)
    except NotFound:
        lock = store.read(f"{name}/{fmt.LOCK}", 4096)
        if store.read(f"{name}/{fmt.RETIRED}", 0) is not None:
            row.update(state="retired")       # removed; newer snapshots still use its data
        else:
            row.update(state="in progress" if lock and _writer_alive(lock) else "partial")
        return row
    except SnapshotDamaged as exc:
        row.update(state="damaged", message=str(exc))
        return row
    row.update(state="complete", created_ns=m["created_ns"], parent=m["parent"],
               allocations=len(m["allocations"]), bytes=m["bytes"],
               bytes_written=m["bytes_written"], host=m.get("host"))
    return row


def _writer_alive(lock: bytes) -> bool:
    """A partial snapshot still being written: by a live process on this host."""
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


def remove(location: str, keep: int | None) -> dict:
    """`snapshot rm`: one named snapshot, or all but the newest `keep` complete ones and
    every partial one no longer being written. Data that a kept snapshot refers to stays."""
    store_loc, named = split_location(location)
    store = open_store(store_loc)
    names = store.names()
    if named:
        if named not in names:
            raise NotFound(f"no snapshot {location}")
        doomed = [named]
    elif keep is None:
        raise UsageError(f"{location} holds {len(names)} snapshot(s): name one "
                         f"({store_loc.rstrip('/')}/snap-...) or give --keep N")
    else:
        rows = {n: _describe(store, n) for n in names}
        complete = [n for n in names if rows[n]["state"] == "complete"]
        kept = set(complete[len(complete) - keep:]) if keep else set()
        doomed = [n for n in names if n not in kept and rows[n]["state"] != "in progress"]
    survivors = [n for n in names if n not in doomed]
    referenced: set[str] = set()
    unreadable = False          # a kept manifest we cannot read may refer to anything
    for n in survivors:
        try:
            referenced |= fmt.keys_of(load_manifest(store, n))
        except NotFound:
            pass                # partial or retired: no manifest refers to anything
        except SnapshotDamaged:
            unreadable = True
    removed, kept_objects = [], 0
    for n in doomed:
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
        kept_objects += len(kept_here)
        removed.append(n)
    return {"location": location, "removed": removed, "kept": survivors,
            "objects_kept_for_newer": kept_objects}
