"""The snapshot format (version 1): names, the manifest and its checks, block checksums.

A snapshot is a directory (or an object-store prefix) `snap-<UTC time>-<random>` in a store:

    <store>/snap-20261123T141500.123456Z-3fa9c1/manifest.json     written last: the commit
    <store>/snap-20261123T141500.123456Z-3fa9c1/data/<n>.bin      data objects (striping.py stripes
                                                                   an allocation over up to 16)
    <store>/snap-20261123T141500.123456Z-3fa9c1/lock.json         only while it is written
    <store>/snap-20261123T141500.123456Z-3fa9c1/retired.json      removed, data still used

An allocation's data is cut in blocks of BLOCK bytes (the last one shorter). The manifest lists
each block's checksum (XXH3-128, hex) and, as extents, where its bytes are: `[first block,
count, object key, byte offset in the object]`. A full snapshot has one extent per stripe
unit (8 MiB; one per allocation in an object store); an incremental one stores only the
blocks that changed and refers to the objects of older snapshots in the same store for the
rest. The manifest carries the SHA-256 of its own
canonical JSON (every key but `checksum`), so a flipped byte anywhere in it is found.

Everything read from a store is hostile input (a store may be shared with other users):
`parse()` checks every field's type and bounds, and object keys must name a data object of a
snapshot in the same store (no `..`, no absolute paths) before anything opens them.
"""
from __future__ import annotations

import calendar
import functools
import hashlib
import json
import os
import re
import time

from ..protocol import GpumemError, Uncorrectable, UsageError
from ..protocol.defaults import SNAPSHOT_BLOCK

FORMAT = "gpumemctl-snapshot"
VERSION = 1
BLOCK = SNAPSHOT_BLOCK                # bytes per checksummed block (1 MiB)
HASH = "xxh3-128"
MANIFEST = "manifest.json"
LOCK = "lock.json"
RETIRED = "retired.json"              # a removed snapshot whose data newer ones still use
MAX_MANIFEST = 256 << 20              # a manifest larger than this is not one of ours (7 TiB
                                      # of data in 1 MiB blocks is 250 MB of manifest)

NAME_RE = re.compile(r"snap-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6}")
KEY_RE = re.compile(r"(snap-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6})/data/(\d{1,9})\.bin")
HEX_RE = re.compile(r"[0-9a-f]{32}")
# An allocation's modified time as the daemon writes it (`info`'s `modified`): UTC, microseconds.
TIME_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})Z")
MAX_TIME_NS = 2**63 - 1               # the registry's times are signed 64-bit nanoseconds


class SnapshotDamaged(Uncorrectable):
    """A manifest or data object that fails its checks (exit 8)."""


def new_name(now_ns: int | None = None) -> str:
    """A name that sorts by creation time: snap-YYYYmmddTHHMMSS.ffffffZ-<6 hex>."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    secs, micros = divmod(now_ns // 1000, 1_000_000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs))
    return f"snap-{stamp}.{micros:06d}Z-{os.urandom(3).hex()}"


def data_key(snapshot: str, index: int) -> str:
    return f"{snapshot}/data/{index}.bin"


def block_count(size: int) -> int:
    return -(-size // BLOCK)


def block_hash(view) -> str:
    return _xxh3()(view)


@functools.lru_cache(maxsize=1)
def _xxh3():
    """xxhash's XXH3-128, loaded by the snapshot commands only (the `snapshot` extra)."""
    try:
        import xxhash
    except ImportError:
        raise UsageError("gpumemctl snapshot needs the xxhash package: install "
                         "gpumemctl[snapshot] (pip install 'gpumemctl[snapshot]')") from None
    return xxhash.xxh3_128_hexdigest


def _canonical(manifest: dict) -> bytes:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal(manifest: dict) -> bytes:
    """The manifest as stored: its canonical JSON with its own checksum, a value per line
    (for a reader with `less`). Not `indent=`: that takes json's pure-Python encoder, 20 ms
    for the 8,192 checksums of 8 GiB, which an incremental snapshot's time is made of."""
    manifest["checksum"] = hashlib.sha256(_canonical(manifest)).hexdigest()
    return json.dumps(manifest, sort_keys=True, separators=(",\n", ":")).encode() + b"\n"


def parse(raw: bytes, where: str) -> dict:
    """A stored manifest, checked: SnapshotDamaged (exit 8) names what is wrong."""
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SnapshotDamaged(f"{where}: the manifest is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise SnapshotDamaged(f"{where}: the manifest is not a JSON object")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise SnapshotDamaged(f"{where}: not a {FORMAT} manifest of version {VERSION} "
                              f"(format {manifest.get('format')!r}, version "
                              f"{manifest.get('version')!r})")
    want = manifest.get("checksum")
    if not isinstance(want, str) or hashlib.sha256(_canonical(manifest)).hexdigest() != want:
        raise SnapshotDamaged(f"{where}: the manifest's checksum does not match its contents "
                              "(it was changed or damaged after it was written)")
    try:
        _check(manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotDamaged(f"{where}: the manifest is malformed: {exc}") from None
    return manifest


def _need(value, kind, what: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{what} is {value!r}")
    return value


def _check(manifest: dict) -> None:
    """Types and bounds of everything restore and verify rely on (the checksum only says
    the manifest is what its writer wrote, not that its writer was honest)."""
    name = _need(manifest["name"], str, "name")
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"name {name!r} is not a snapshot name")
    if manifest["block_size"] != BLOCK or manifest["hash"] != HASH:
        raise ValueError(f"block size {manifest['block_size']!r} / hash {manifest['hash']!r}")
    if manifest.get("parent") is not None and not NAME_RE.fullmatch(str(manifest["parent"])):
        raise ValueError(f"parent {manifest['parent']!r}")
    seen = set()
    for i, entry in enumerate(_need(manifest["allocations"], list, "allocations")):
        what = f"allocation {i}"
        _need(entry, dict, what)
        path = _need(entry["path"], str, f"{what} path")
        if path in seen or any(p in ("", ".", "..") for p in path.split("/")) \
                or "\x00" in path:
            raise ValueError(f"{what} path {path!r} (empty, absolute, '.', '..' or twice)")
        seen.add(path)
        size = _need(entry["size"], int, f"{what} size")
        for key in ("mode", "uid", "gid"):
            _need(entry[key], int, f"{what} {key}")
        _need(entry["durable"], bool, f"{what} durable")
        _check_names(entry.get("names", []), path, what)
        modified_ns(entry, what)
        if entry["ecc"] not in ("rs", "none"):
            raise ValueError(f"{what} ecc {entry['ecc']!r}")
        blocks = _need(entry["blocks"], list, f"{what} blocks")
        if size < 0 or len(blocks) != block_count(size):
            raise ValueError(f"{what} has {len(blocks)} block checksums for size {size}")
        if not all(isinstance(b, str) and HEX_RE.fullmatch(b) for b in blocks):
            raise ValueError(f"{what} has a block checksum that is not 32 hex digits")
        _check_extents(entry, len(blocks), what)


def _check_names(names, path: str, what: str) -> None:
    """Further hard-link names: relative names of allocations, as a path is (a restore
    makes them, under --as PREFIX too, so none may climb out with '..')."""
    for name in _need(names, list, f"{what} names"):
        parts = _need(name, str, f"{what} name").split("/")
        if name == path or "\x00" in name or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{what} name {name!r} (empty, absolute, '.', '..' or the "
                             "path itself)")


def modified_ns(entry: dict, what: str = "allocation") -> int | None:
    """The entry's `modified` (the allocation's modification time when it was copied) in
    nanoseconds since the epoch, for a restore to give back; None where the entry has none.
    ValueError says what is wrong with one that is not a time of the daemon's form, or lies
    before 1970 or past what the registry holds (2262)."""
    value = entry.get("modified")
    if value is None:
        return None
    m = TIME_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        shown = repr(value)
        shown = shown if len(shown) <= 64 else f"{shown[:60]}..."
        raise ValueError(f"{what} modified is {shown}: expected null or a UTC time "
                         "YYYY-MM-DDTHH:MM:SS.ffffffZ")
    year, month, day, hour, minute, second, micros = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(max(year, 1), month)[1]
            and hour < 24 and minute < 60 and second < 60):
        raise ValueError(f"{what} modified {value!r} is not a date and time")
    ns = (calendar.timegm((year, month, day, hour, minute, second)) * 1_000_000
          + micros) * 1000 if 1970 <= year <= 2262 else -1
    if not 0 <= ns <= MAX_TIME_NS:
        raise ValueError(f"{what} modified {value!r} is outside 1970-01-01 to "
                         "2262-04-11, the times an allocation can have")
    return ns


def _check_extents(entry: dict, nblocks: int, what: str) -> None:
    covered = 0
    for ext in _need(entry["extents"], list, f"{what} extents"):
        if not isinstance(ext, list) or len(ext) != 4:
            raise ValueError(f"{what} extent {ext!r}")
        first, count, key, offset = ext
        for v in (first, count, offset):
            _need(v, int, f"{what} extent {ext!r}")
        if first != covered or count < 1 or offset < 0 or not KEY_RE.fullmatch(str(key)):
            raise ValueError(f"{what} extent {ext!r} (extents must cover the blocks in order "
                             "and name data objects of this store)")
        covered += count
    if covered != nblocks:
        raise ValueError(f"{what} extents cover {covered} of {nblocks} blocks")


def extent_blocks(entry: dict):
    """(block index, object key, byte offset in the object, length) for each block."""
    size = entry["size"]
    for first, count, key, offset in entry["extents"]:
        for k in range(count):
            b = first + k
            yield b, key, offset + k * BLOCK, min(BLOCK, size - b * BLOCK)


def keys_of(manifest: dict) -> set[str]:
    """Every data object a manifest refers to (its own and older snapshots')."""
    return {ext[2] for entry in manifest["allocations"] for ext in entry["extents"]}


def snapshot_of_key(key: str) -> str:
    m = KEY_RE.fullmatch(key)
    if not m:
        raise GpumemError(f"not a data object key: {key!r}")
    return m.group(1)


def ranges_of(blocks: list[int], size: int) -> list[list[int]]:
    """Sorted block indices as byte ranges [start, end), merged, clipped to `size`."""
    out: list[list[int]] = []
    for b in sorted(blocks):
        start, end = b * BLOCK, min((b + 1) * BLOCK, size)
        if out and out[-1][1] == start:
            out[-1][1] = end
        else:
            out.append([start, end])
    return out


def check_location(text: str) -> str:
    if not text or "\x00" in text:
        raise UsageError(f"invalid snapshot location {text!r}: expected a directory or "
                         "s3://bucket/prefix")
    return text
