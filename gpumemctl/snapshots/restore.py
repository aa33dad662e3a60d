"""`gpumemctl snapshot restore` (docs/snapshots.md): allocations brought back from a store.

From a store, each allocation comes from the newest complete snapshot that holds it and that
the caller trusts (trust.py): an incremental snapshot of one allocation does not hide the
others its predecessors hold. Snapshots passed over (someone else's files, a damaged
manifest) are named, and the restore ends with their exit code once it restored the rest.
From one snapshot named (`STORE/snap-...`), only that one is read.

Before an allocation is touched, each field the restore acts on is checked against what the
caller may do (trust.py): a lost allocation is refilled only with its owner's entry of its
size, root makes further names only in directories of root or the owner, and every data
object it will read is opened and checked first. Then it is refilled through a handle in
state `restoring`: until the daemon hears it completed it is not served, and a restore that
dies leaves it `lost`, never half-filled and `ready`.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..protocol import Exists, GpumemError, NotFound, PermissionDenied, error_from_wire
from . import devpath, gds, gpuhash
from . import manifest as fmt
from .blocks import (
    Progress,
    Readers,
    big_chunks,
    contiguous,
    fill_chunk,
    gather,
    hash_jobs,
    noop,
    places_of,
)
from .catalog import Sources, load_manifest, split_location
from .manifest import BLOCK
from .stores import open_store
from .trust import Trust, check_names, check_refill


def restore(client, location: str, names: list[str], *, as_prefix: str | None = None,
            device: str | None = None, force: bool = False, lost_only: bool = False,
            progress: Progress = noop, trust_uids: frozenset[int] = frozenset()) -> dict:
    """Restore the allocations (those under `names`, or all): a missing name is created, a
    `lost` one refilled in place, an existing one refused unless `force`. `lost_only`:
    refill lost allocations only, create nothing (restore_on_start)."""
    store_loc, named = split_location(location)
    trust = Trust(frozenset(trust_uids))
    with open_store(store_loc) as store:
        sources, passed = _sources(store, named, trust, location)
        picks = _pick(sources, names, passed, store_loc)
        seen: dict[str, dict | None] = {}
        if lost_only:
            picks = [(s, e) for s, e in picks
                     if (_info(client, _target(e["path"], as_prefix), seen) or {})
                     .get("state") == "lost"]
        outcome = _restore_all(client, store, picks, trust, seen, as_prefix=as_prefix,
                               device=device, force=force, progress=progress)
        used = sorted({r["snapshot"] for r in outcome["allocations"]}, reverse=True)
        newest = used[0] if used else (sources[0][0] if sources else None)
        where = store.where(newest) if newest and (named or len(used) <= 1) else location
    return {"snapshot": newest, "snapshots": used, "location": where, "store": store_loc,
            **outcome, "passed_over": passed}


def _sources(store, named: str | None, trust: Trust,
             location: str) -> tuple[list[tuple[str, dict]], list[dict]]:
    """The snapshots to restore from, newest first, and those passed over."""
    if named:
        return [(named, load_manifest(store, named, trust))], []
    found = Sources(store, trust)
    sources = list(found.each())
    if not sources and not found.passed:
        raise NotFound(f"{location} holds no complete snapshot")
    return sources, found.passed


def _pick(sources: list[tuple[str, dict]], names: list[str], passed: list[dict],
          store_loc: str) -> list[tuple[str, dict]]:
    """(snapshot, entry) of each allocation to restore: the newest trusted copy of each
    name. An entry's further names count as taken too, so an older snapshot's copy of a
    hard-linked allocation is not restored beside the newer one."""
    wanted = [n.strip("/") for n in names]
    taken: set[str] = set()
    out: list[tuple[str, dict]] = []
    for snapshot, manifest in sources:
        for entry in manifest["allocations"]:
            its_names = {entry["path"], *(entry.get("names") or [])}
            if its_names & taken or not _selected(entry["path"], wanted):
                continue
            taken |= its_names
            out.append((snapshot, entry))
    for name in wanted:
        if not any(_selected(e["path"], [name]) for _s, e in out):
            if not passed:
                where = (f"snapshot {sources[0][0]}" if len(sources) == 1
                         else f"no complete snapshot in {store_loc}")
                raise NotFound(f"{where} holds no allocation '{name}'")
            raise error_from_wire({"code": passed[0]["code"], "message": (
                f"no complete snapshot you trust in {store_loc} holds '{name}'; "
                f"{len(passed)} passed over: {passed[0]['message']}")})
    return out


def _selected(path: str, wanted: list[str]) -> bool:
    return not wanted or any(path == n or path.startswith(n + "/") for n in wanted)


def _info(client, path: str, seen: dict[str, dict | None]) -> dict | None:
    """`info` of a restore's target, asked once (None: it does not exist, or the caller
    may not see it)."""
    if path not in seen:
        try:
            seen[path] = client.info(path)
        except (NotFound, PermissionDenied):
            seen[path] = None
    return seen[path]


def _target(path: str, prefix: str | None) -> str:
    return f"{prefix.strip('/')}/{path}" if prefix else path


def _restore_all(client, store, picks: list[tuple[str, dict]], trust: Trust,
                 seen: dict[str, dict | None], *, as_prefix: str | None, device: str | None,
                 force: bool, progress: Progress) -> dict:
    """Each allocation in turn; what failed is a result of its own, and only what was moved
    counts in `bytes` and `rate`."""
    total = sum(e["size"] for _s, e in picks)
    done, moved, started = 0, 0, time.monotonic()
    results: list[dict] = []
    failures: list[GpumemError] = []
    readers = Readers(store, trust)
    try:
        for snapshot, entry in picks:
            target = _target(entry["path"], as_prefix)

            def advance(n: int, base: int = done, t: str = target) -> None:
                progress(base + n, total, t)

            try:
                result = _restore_one(client, entry, target, _info(client, target, seen),
                                      store.where(snapshot), device, force, readers, advance)
            except GpumemError as exc:
                failures.append(exc)
                results.append({"path": target, "from": entry["path"], "snapshot": snapshot,
                                "size": entry["size"], "result": exc.name,
                                "message": str(exc)})
            else:
                results.append({**result, "snapshot": snapshot})
                moved += entry["size"]
            done += entry["size"]
    finally:
        readers.close()
    seconds = time.monotonic() - started
    return {"io": gds.io_kind(store, any(r.get("kvikio") for r in results)),
            "checksums": gpuhash.hash_path({r.get("checksums") for r in results}),
            "allocations": results, "damaged": sum(1 for r in results if r.get("damaged")),
            "failed": len(failures), "bytes": moved, "seconds": round(seconds, 6),
            "rate": int(moved / seconds) if moved and seconds > 0 else None,
            "_failures": failures}


def _vet(client, entry: dict, target: str, info: dict | None, where: str,
         readers: Readers) -> list[str]:
    """Refuse the entry before anything changes if it asks for more than the caller may do
    (trust.py) or reads a data object the caller does not trust; the further names to
    make (those the allocation does not have already)."""
    prefix = target[:len(target) - len(entry["path"])]
    names = [name for extra in entry.get("names") or []
             if not _names_it(client, name := f"{prefix}{extra}", info)]
    if info is not None and info.get("state") == "lost":
        check_refill(entry, info, where)
    check_names(client, names, info["uid"] if info is not None else os.geteuid())
    readers.check(entry)
    return names


def _restore_one(client, entry: dict, target: str, info: dict | None, where: str,
                 device: str | None, force: bool, readers: Readers,
                 advance: Callable[[int], None]) -> dict:
    names = _vet(client, entry, target, info, where, readers)
    places = places_of(entry)
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
        fill_chunk(at, view, entry, places, readers, bad)
        moved += len(view)
        advance(moved)

    kvikio = gds.use_kvikio(handle.memory, readers.store)
    hasher = gpuhash.for_memory(handle.memory)
    big_chunks(handle.memory)
    with handle:
        if kvikio:
            _file_to_device(handle.memory, entry, places, readers, bad, advance, hasher)
        elif hasher is not None:
            devpath.restore(handle.memory, entry, places, readers, hasher, bad, advance)
        else:
            handle.memory.fill(0, entry["size"], source)
        ranges = fmt.ranges_of(bad, entry["size"])
        handle.restored = _outcome(entry, ranges)
    for name in names:
        _relink(client, target, name)
    return {"path": target, "from": entry["path"], "size": entry["size"],
            "result": "degraded" if ranges else "ok", "damaged": ranges, "kvikio": kvikio,
            "checksums": "gpu" if hasher is not None else "cpu"}


def _outcome(entry: dict, ranges: list) -> dict:
    """What the refill's close tells gpumemd: the damaged ranges, and the modification time
    the allocation had when it was copied (checked by manifest.parse), which it keeps."""
    outcome: dict = {"damaged": ranges}
    mtime = fmt.modified_ns(entry)
    if mtime is not None:
        outcome["modified_ns"] = mtime
    return outcome


def _file_to_device(memory, entry: dict, places: dict, readers: Readers, bad: list[int],
                    advance: Callable[[int], None], hasher=None) -> None:
    """Restore into GPU memory by KvikIO, then check each block where it landed: on the GPU
    (`hasher`, gpuhash.py), else from a device-to-host pass; a block that fails is zeroed
    on the device and listed in `bad`."""
    from .. import cudadrv
    size = entry["size"]
    for at in range(0, size, gds.CHUNK):
        n = min(gds.CHUNK, size - at)
        first = at // BLOCK
        failed: set[int] = set()
        for k0, k1 in contiguous(first, fmt.block_count(n), places):
            key, off = places[first + k0]
            length = min(k1 * BLOCK, n) - k0 * BLOCK
            try:
                got = gds.read_device(readers.get(key).proc_path, memory.device,
                                      memory.ptr + at + k0 * BLOCK, length, off)
            except Exception:  # noqa: BLE001 - a missing or short object: damaged blocks
                got = -1
            if got != length:
                failed.update(range(first + k0, first + k1))
        found: list[int] = []

        def check(where: int, view: memoryview, found=found, failed=failed) -> None:
            b0 = where // BLOCK
            found.extend(b0 + k for k, h in enumerate(gather(hash_jobs(view)))
                         if b0 + k in failed or h != entry["blocks"][b0 + k])

        if hasher is not None:
            found = [first + k for k, h in enumerate(hasher.hash(memory.ptr + at, n))
                     if first + k in failed or h != entry["blocks"][first + k]]
        else:
            memory.drain(at, n, check)
        with cudadrv.context(memory.device):
            for b in found:
                cudadrv.memset_d8(memory.ptr + b * BLOCK, 0, min(BLOCK, size - b * BLOCK))
            if found:
                cudadrv.ctx_synchronize()
        bad += found
        advance(n)


def _names_it(client, name: str, info: dict | None) -> bool:
    """Whether `name` is already a name of the allocation `info` describes (a lost one
    keeps its names): nothing to make, nothing to check."""
    if info is None:
        return False
    try:
        return client.info(name).get("id") == info.get("id")
    except (NotFound, PermissionDenied):
        return False


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
