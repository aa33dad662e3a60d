"""`gpumemctl load` and `gpumemctl save`: safetensors files into allocations and back
(docs/tensors.md).

A safetensors file is 8 bytes of header length, a JSON header naming each tensor's dtype,
shape and byte range, and then the tensors' bytes. `load` makes one allocation per file
holding exactly those bytes (so every range in the header stays valid) and keeps the header,
byte for byte, as the allocation's metadata key `safetensors`; `save` writes the three parts
back, so an unchanged allocation saves to a file identical to its source. A sharded model
(its `*.safetensors.index.json`, or a directory of files) becomes a directory holding one
allocation per shard, the index's text kept on the directory (`safetensors.index`).

The format is checked by the `safetensors` library (every file is opened with it before
anything is allocated); the index file is plain JSON. Each allocation is filled through a
`refill` handle, as a snapshot restore fills one: it is `restoring` until its bytes are all
written, and no shard is declared whole before every shard is written: a load that fails
or is killed half-way leaves no allocation (the daemon removes each whose refill did not
finish), and this module removes the directories it created.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from .protocol import Exists, NotFound, UsageError
from .tensors import HEADER_KEY, INDEX_KEY, parse_header

INDEX_NAME_KEY = "safetensors.index.name"   # the index file's own name, for `save`
INDEX_SUFFIX = ".safetensors.index.json"
SUFFIX = ".safetensors"
LENGTH_BYTES = 8                            # the header's length, little-endian u64


@dataclass
class Shard:
    src: str                # the file
    name: str               # the allocation it becomes
    header: str             # its JSON header, verbatim (padding included)
    data_offset: int        # where the tensor bytes start in the file
    data_len: int
    tensors: int


@dataclass
class Plan:
    src: str
    name: str
    directory: bool         # a sharded model: `name` is a directory of shards
    shards: list[Shard] = field(default_factory=list)
    index: str | None = None        # the index file's text
    index_name: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(s.data_len for s in self.shards)


# ---- checking the input (before anything is allocated) ----------------------------------------
def plan(src: str, name: str) -> Plan:
    """What loading `src` as `name` will make; every file checked, nothing allocated."""
    name = name.strip("/")
    if not name:
        raise UsageError("invalid name '': expected an allocation name such as models/llama")
    if os.path.isdir(src):
        return _plan_directory(src, name)
    if src.endswith(INDEX_SUFFIX) or src.endswith(".index.json"):
        return _plan_index(src, name)
    if not os.path.exists(src):
        raise UsageError(f"{src}: no such file")
    return Plan(src, name, False, [_check_file(src, name)])


def _plan_directory(src: str, name: str) -> Plan:
    try:
        files = sorted(os.listdir(src))
    except OSError as exc:
        raise UsageError(f"cannot read directory {src}: {exc.strerror}") from None
    indexes = [f for f in files if f.endswith(INDEX_SUFFIX)]
    if len(indexes) > 1:
        raise UsageError(f"{src}: holds {len(indexes)} index files ({', '.join(indexes)}): "
                         "name the one to load")
    if indexes:
        return _plan_index(os.path.join(src, indexes[0]), name)
    shards = [f for f in files if f.endswith(SUFFIX)]
    if not shards:
        raise UsageError(f"{src}: no {SUFFIX} file in this directory")
    return Plan(src, name, True,
                [_check_file(os.path.join(src, f), f"{name}/{f}") for f in shards])


def _plan_index(src: str, name: str) -> Plan:
    try:
        with open(src, "rb") as f:
            raw = f.read(64 << 20)
    except OSError as exc:
        raise UsageError(f"cannot read {src}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
        index = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{src}: not a JSON index file: {exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise UsageError(f"{src}: expected an object with a \"weight_map\" of tensor name "
                         "-> shard file name")
    by_file: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        if "/" in file or file in ("", ".", ".."):
            raise UsageError(f"{src}: shard {file!r} (of tensor {tensor!r}) is not a file "
                             "name in the index's directory")
        by_file.setdefault(file, []).append(tensor)
    base = os.path.dirname(src) or "."
    plan_ = Plan(src, name, True, index=text, index_name=os.path.basename(src))
    for file in sorted(by_file):
        path = os.path.join(base, file)
        if not os.path.exists(path):
            raise UsageError(f"{src}: shard {file} is missing (no file {path})")
        shard = _check_file(path, f"{name}/{file}")
        held = json.loads(shard.header)
        absent = [t for t in by_file[file] if t not in held]
        if absent:
            raise UsageError(f"{src}: tensor {absent[0]!r} is mapped to shard {file}, which "
                             f"does not hold it ({len(absent)} such tensor(s))")
        plan_.shards.append(shard)
    return plan_


def _check_file(path: str, name: str) -> Shard:
    """A safetensors file, checked by the library itself; its header read verbatim."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(path, framework="numpy") as st:
            count = len(st.keys())
    except SafetensorError as exc:
        raise UsageError(f"{path}: not a valid safetensors file: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(LENGTH_BYTES), "little")
        header = f.read(length)
        size = os.fstat(f.fileno()).st_size
    start = LENGTH_BYTES + length
    return Shard(path, name, header.decode("utf-8"), start, size - start, count)


# ---- load ---------------------------------------------------------------------------------------
Progress = Callable[[int, int], None]


def load(c, plan_: Plan, *, durable: bool = False, device: str | None = None,
         mode: int = 0o600, ecc: str | None = None,
         progress: Progress | None = None) -> dict:
    """Make the allocations of `plan_` and fill them; on any failure remove what was made."""
    for shard in plan_.shards:
        _require_absent(c, shard.name)
    if plan_.directory:
        _require_absent(c, plan_.name)
    made_dirs = _make_parents(c, plan_.name if plan_.directory else _parent(plan_.name))
    made: list[str] = []          # finished: removed again if a later step fails
    filling: list = []            # (handle, phases) of each shard written, not yet finished
    phases: list[dict] = []
    began, moved = time.monotonic(), 0
    try:
        if plan_.directory and plan_.index is not None:
            c.meta_set(plan_.name, INDEX_KEY, plan_.index)
            c.meta_set(plan_.name, INDEX_NAME_KEY, plan_.index_name or "")
        for shard in plan_.shards:
            filling.append(_fill(c, shard, durable, device, mode, ecc,
                                 _offset_progress(progress, moved, plan_.nbytes)))
            phases.append(filling[-1][1])
            moved += shard.data_len
        # Every shard is written before any is finished: until then each is `restoring`,
        # so a load killed at any point leaves no shard behind (the daemon removes them).
        while filling:
            handle, timing = filling[0]
            timing["finish"] = _finish(handle)
            filling.pop(0)
            made.append(handle.info["path"])
    except BaseException:
        for handle, _ in filling:
            _abandon(handle)
        _undo(c, made, made_dirs)
        raise
    seconds = time.monotonic() - began
    return {"name": plan_.name, "source": plan_.src, "bytes": moved,
            "tensors": sum(s.tensors for s in plan_.shards), "seconds": round(seconds, 6),
            "copy_seconds": round(sum(p["copy"] for p in phases), 6),
            "allocations": [{"name": s.name, "source": s.src, "bytes": s.data_len,
                             "tensors": s.tensors, "seconds": p}
                            for s, p in zip(plan_.shards, phases, strict=True)]}


def _offset_progress(progress: Progress | None, base: int,
                     total: int) -> Callable[[int], None]:
    """A callback for one file's bytes moved, reporting them after `base` of `total`."""
    def advance(n: int) -> None:
        if progress is not None:
            progress(base + n, total)
    return advance


def _fill(c, shard: Shard, durable: bool, device: str | None, mode: int,
          ecc: str | None, advance: Callable[[int], None]) -> tuple:
    """Write one allocation from its file through a refill handle (module docstring),
    left open: (handle, seconds of `create`, the allocation made and mapped here, and
    `copy`, the file's bytes to the memory)."""
    began = time.monotonic()
    handle = c.refill(shard.name, size=max(shard.data_len, 1), mode=mode, ecc=ecc,
                      durable=durable, device=device, metadata={HEADER_KEY: shard.header})
    done = 0

    def moved(n: int) -> None:
        nonlocal done
        done = n
        advance(n)

    made = time.monotonic()
    try:
        with open(shard.src, "rb") as src:
            src.seek(shard.data_offset)
            too_long = handle.memory.write_from(src, 0, handle.size, moved)
        if done:
            handle._note_write(0, done)
        if too_long or done != shard.data_len:
            raise UsageError(f"{shard.src}: changed while it was loaded ({done} bytes of "
                             f"tensors read, {shard.data_len} expected)")
    except BaseException:
        _abandon(handle)
        raise
    return handle, {"create": round(made - began, 6),
                    "copy": round(time.monotonic() - made, 6)}


def _finish(handle) -> float:
    """Say the allocation is whole: the daemon computes its parity, commits it `ready` and
    (durable) hands it to the keeper. Returns the seconds it took."""
    began = time.monotonic()
    handle.restored = {"damaged": []}
    handle.close()
    return round(time.monotonic() - began, 6)


def _abandon(handle) -> None:
    """Close without `restored`: the daemon removes the allocation it made for us."""
    try:
        handle.close()
    except Exception:   # noqa: BLE001 - cleanup after the error being reported
        pass


def _require_absent(c, name: str) -> None:
    try:
        c.info(name)
    except NotFound:
        return
    raise Exists(f"'{name}' exists: remove it first, or load under another name")


def _parent(name: str) -> str:
    return name.rpartition("/")[0]


def _make_parents(c, path: str) -> list[str]:
    """mkdir each missing component of `path`, top down; the ones made, in that order."""
    made: list[str] = []
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        prefix = "/".join(parts[:i + 1])
        try:
            c.info(prefix)
        except NotFound:
            try:
                c.mkdir(prefix)
            except BaseException:
                _undo(c, [], made)
                raise
            made.append(prefix)
    return made


def _undo(c, allocations: list[str], dirs: list[str]) -> None:
    """Remove what a failed load made (best effort: the first error is the one reported)."""
    for name in allocations:
        try:
            c.remove(name, force=True)
        except Exception:   # noqa: BLE001 - cleanup after the error being reported
            pass
    for name in reversed(dirs):        # deepest first, and only while empty: nothing that
        try:                           # another client put there meanwhile is removed
            if not c.ls(name):         # (the socket has no rmdir; -r of an empty one is it)
                c.remove(name, recursive=True)
        except Exception:   # noqa: BLE001
            pass


# ---- save ---------------------------------------------------------------------------------------
def save(c, name: str, out: str, progress: Progress | None = None) -> dict:
    """Write allocation `name` to the safetensors file `out`, or a directory of shards
    (with its index file) to the directory `out`. Each file is written to a temporary
    name, fsynced and renamed, so `out` is never half written."""
    from .tensors import _shard_infos
    info = c.info(name)
    began = time.monotonic()
    if info.get("type") == "directory":
        infos = _shard_infos(c, name)
        files = [(i, os.path.join(out, i["path"][len(name.rstrip("/")) + 1:]))
                 for i in infos]
        os.makedirs(out, exist_ok=True)
    else:
        infos, files = [info], [(info, out)]
    total = sum(_data_len(i) for i in infos)
    moved = 0
    written = []
    for shard_info, path in files:
        n = _save_file(c, shard_info, path, _offset_progress(progress, moved, total))
        moved += n
        written.append({"name": shard_info["path"], "file": path, "bytes": n})
    if info.get("type") == "directory":
        meta = info.get("metadata") or {}
        if INDEX_KEY in meta:
            path = os.path.join(out, meta.get(INDEX_NAME_KEY) or "model" + INDEX_SUFFIX)
            text = meta[INDEX_KEY].encode("utf-8")
            _write_atomically(path, lambda f: f.write(text))
            written.append({"name": name, "file": path, "bytes": 0})
    return {"name": name, "out": out, "bytes": moved, "files": written,
            "seconds": round(time.monotonic() - began, 6)}


def _data_len(info: dict) -> int:
    from .tensors import _header_of
    tensors, _ = parse_header(_header_of(info), info["path"], info.get("size") or 0)
    return max((t.end for t in tensors.values()), default=0)


def _save_file(c, info: dict, path: str, advance: Callable[[int], None]) -> int:
    from .tensors import _header_of
    header = _header_of(info).encode("utf-8")
    length = _data_len(info)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)

    def write(f) -> None:
        f.write(len(header).to_bytes(LENGTH_BYTES, "little") + header)
        if length:
            c.read_to(info["path"], f, 0, length, progress=lambda d, _t: advance(d))

    _write_atomically(path, write)
    return length


def _write_atomically(path: str, write: Callable[[BinaryIO], object]) -> None:
    """`write(f)` into a temporary file beside `path`, fsynced, then renamed to `path`: a
    reader (or a crash) never finds it half written."""
    tmp = f"{path}.gpumemctl-{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _discard(tmp)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
