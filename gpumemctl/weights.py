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

from . import localfiles, refillreport
from .protocol import Exists, NotFound, UsageError
from .protocol.framing import MAX_REQUEST_BYTES
from .tensors import HEADER_KEY, INDEX_KEY, parse_header

INDEX_NAME_KEY = "safetensors.index.name"   # the index file's own name, for `save`
INDEX_SUFFIX = ".safetensors.index.json"
SUFFIX = ".safetensors"
LENGTH_BYTES = 8                            # the header's length, little-endian u64
DEFAULT_INDEX_NAME = "model" + INDEX_SUFFIX
# A header (an index) is kept as metadata, which one request carries whole: past this it
# can never be stored, whatever gpumemd's metadata_max_bytes (512K by default, 896K at most).
TEXT_MAX_BYTES = MAX_REQUEST_BYTES


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
    return Plan(src, name, False, [_check_file(src, name)])


def _plan_directory(src: str, name: str) -> Plan:
    try:
        files = sorted(os.listdir(src))
    except OSError as exc:
        raise localfiles.file_error(exc, src, "read directory") from None
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
    with localfiles.open_input(src) as f:
        try:
            raw = f.read(TEXT_MAX_BYTES + 1)
        except OSError as exc:
            raise localfiles.file_error(exc, src, "read") from None
    _require_storable(src, "index file", len(raw))
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
    """A safetensors file, checked by the library itself; its header read verbatim. A
    header too large to keep is refused before the library parses it (a 90 MB one)."""
    from safetensors import SafetensorError, safe_open
    with localfiles.open_input(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            length = int.from_bytes(f.read(LENGTH_BYTES), "little")
            if length <= size - LENGTH_BYTES:   # else not safetensors: the library says so
                _require_storable(path, "header", length)
            try:
                with safe_open(path, framework="numpy") as st:
                    count = len(st.keys())
            except SafetensorError as exc:
                raise UsageError(f"{path}: not a valid safetensors file: {exc}") from None
            header = f.read(length)
        except OSError as exc:
            raise localfiles.file_error(exc, path, "read") from None
    start = LENGTH_BYTES + length
    return Shard(path, name, header.decode("utf-8"), start, size - start, count)


def _require_storable(path: str, what: str, nbytes: int) -> None:
    if nbytes > TEXT_MAX_BYTES:
        raise UsageError(f"{path}: its {what} is {nbytes} bytes, more than the "
                         f"{TEXT_MAX_BYTES} one request to gpumemd carries; load keeps it as "
                         "metadata, at most metadata_max_bytes (512K by default, 896K at "
                         "most): nothing made")


def _too_large(src: str, what: str, nbytes: int, exc: UsageError) -> UsageError:
    """The daemon's (or the client's) "too large" for metadata, naming the file."""
    if exc.details.get("errno") not in ("ENOSPC", "E2BIG"):
        return exc
    return UsageError(f"{src}: its {what} ({nbytes} bytes) cannot be kept as metadata: {exc}",
                      details=exc.details)


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
            try:
                c.meta_set(plan_.name, INDEX_KEY, plan_.index)
            except UsageError as exc:
                raise _too_large(plan_.src, "index file", len(plan_.index.encode()),
                                 exc) from None
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
    try:
        handle = c.refill(shard.name, size=max(shard.data_len, 1), mode=mode, ecc=ecc,
                          durable=durable, device=device, metadata={HEADER_KEY: shard.header})
    except UsageError as exc:
        raise _too_large(shard.src, "header", len(shard.header.encode()), exc) from None
    done = 0
    reporter: refillreport.Reporter | None = None     # the parity encoded as it copies

    def moved(n: int) -> None:
        nonlocal done
        done = n
        advance(n)
        if reporter is not None:
            reporter.advance(n)

    made = time.monotonic()
    try:
        reporter = refillreport.start(handle)
        with localfiles.open_input(shard.src) as src:
            src.seek(shard.data_offset)
            too_long = handle.memory.write_from(src, 0, handle.size, moved)
        # The close encodes the parity of what was not reported (all of it, without reports)
        rest = reporter.finish() if reporter is not None else [[0, done]]
        reporter = None
        for start, end in rest:
            handle._note_write(start, min(end, done) - start)
        if too_long or done != shard.data_len:
            raise UsageError(f"{shard.src}: changed while it was loaded ({done} bytes of "
                             f"tensors read, {shard.data_len} expected)")
    except BaseException:
        if reporter is not None:
            reporter.finish()         # its thread uses the connection: done before the close
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
# Root may save what another user loaded: every name that comes from the daemon (a shard's
# path, the index file's name in metadata) is data, checked to be file names under OUT,
# and every file is written by gpumemctl/localfiles.py (no link followed; docs/tensors.md).
def save(c, name: str, out: str, progress: Progress | None = None) -> dict:
    """Write allocation `name` to the safetensors file `out` (`-`: stdout), or a directory
    of shards (with its index file) into the directory `out`. Each file is written to a
    temporary name, fsynced and renamed, so a file is never half written."""
    from .tensors import _shard_infos
    info = c.info(name)
    began = time.monotonic()
    if info.get("type") == "directory":
        if out == "-":
            raise UsageError(f"'{name}' is a directory of shards: save it into a directory, "
                             "not '-' (stdout takes one allocation's file)")
        files = _shard_files(info, _shard_infos(c, name))
        index = _index_file(name, info, files)
        moved, written = _save_tree(c, name, out, files, index, progress)
    else:
        total = _data_len(info)
        write = _file_writer(c, info, _offset_progress(progress, 0, total))
        if out == "-":
            _to_stdout(write)
        else:
            localfiles.write_file(out, write)
        moved, written = total, [{"name": info["path"], "file": out, "bytes": total}]
    return {"name": name, "out": out, "bytes": moved, "files": written,
            "seconds": round(time.monotonic() - began, 6)}


def _shard_files(top: dict, infos: list[dict]) -> list[tuple[dict, list[str]]]:
    """Each shard and its file's path under OUT, as components: its allocation path below
    the directory, each component a plain file name (checked, never a path)."""
    base = top["path"].strip("/")
    files = []
    for shard in infos:
        path = shard["path"].strip("/")
        if not path.startswith(base + "/" if base else ""):
            raise UsageError(f"'{path}' is not under '{base}': refused, nothing written")
        parts = path[len(base) + 1 if base else 0:].split("/")
        for part in parts:
            localfiles.check_component(part, f"shard '{path}': component")
        files.append((shard, parts))
    return files


def _index_file(name: str, info: dict, files: list) -> tuple[str, bytes] | None:
    """The index file to write beside the shards: (file name, text), or None. The name is
    metadata anyone who may write the directory can set: a name that is not one plain
    `.json` file name, or that is a shard's, is refused before anything is written (rather
    than replaced by the default: a save that quietly writes another name than the stored
    one hides that the metadata is not what load made)."""
    meta = info.get("metadata") or {}
    if INDEX_KEY not in meta:
        return None
    file = meta.get(INDEX_NAME_KEY) or DEFAULT_INDEX_NAME
    try:
        localfiles.check_component(file, "index file name")
        plain = file.endswith(".json") and file not in {parts[0] for _, parts in files}
    except UsageError:
        plain = False
    if not plain:
        raise UsageError(f"'{name}': metadata {INDEX_NAME_KEY} {file!r} is not one .json "
                         "file name beside the shards (no '/', not '.' or '..', at most "
                         f"{localfiles.NAME_MAX} bytes, not a shard's): refused, nothing "
                         f"written (`gpumemctl meta set {name} {INDEX_NAME_KEY} "
                         f"{DEFAULT_INDEX_NAME}` repairs it)")
    return file, meta[INDEX_KEY].encode("utf-8")


def _save_tree(c, name: str, out: str, files: list, index: tuple[str, bytes] | None,
               progress: Progress | None) -> tuple[int, list[dict]]:
    """The shards (and index) into directory `out`: every target checked first, so that a
    refusal (a link, a device where a file goes) writes nothing."""
    total = sum(_data_len(shard) for shard, _ in files)
    targets = [parts for _, parts in files] + ([[index[0]]] if index else [])
    moved, written = 0, []
    with localfiles.open_out_dir(out) as top:
        for parts in targets:
            _walk(top, parts, make=False)
        for shard, parts in files:
            n = _data_len(shard)
            _walk(top, parts, make=True,
                  write=_file_writer(c, shard, _offset_progress(progress, moved, total)))
            moved += n
            written.append({"name": shard["path"], "file": os.path.join(out, *parts),
                            "bytes": n})
        if index is not None:
            text = index[1]
            top.write_file(index[0], lambda f: f.write(text))
            written.append({"name": name, "file": os.path.join(out, index[0]), "bytes": 0})
    return moved, written


def _walk(top: localfiles.OutDir, parts: list[str], make: bool,
          write: Callable[[BinaryIO], object] | None = None) -> None:
    """Down `parts[:-1]` from `top` (each directory opened by the fd of the one above, never
    through a link; made if `make`), then: check the file target, or write it."""
    opened: list[localfiles.OutDir] = []
    here = top
    try:
        for part in parts[:-1]:
            if not make and here.lstat(part) is None:
                return              # nothing there yet: nothing below it to refuse
            here = here.subdir(part, make=make)
            opened.append(here)
        if write is None:
            here.check_file_target(parts[-1])
        else:
            here.write_file(parts[-1], write)
    finally:
        for d in opened:
            d.close()


def _data_len(info: dict) -> int:
    from .tensors import _header_of
    tensors, _ = parse_header(_header_of(info), info["path"], info.get("size") or 0)
    return max((t.end for t in tensors.values()), default=0)


def _file_writer(c, info: dict, advance: Callable[[int], None]) -> Callable[[BinaryIO], None]:
    """What writes one allocation's safetensors file to an open file: length, header, bytes."""
    from .tensors import _header_of
    header = _header_of(info).encode("utf-8")
    length = _data_len(info)

    def write(f: BinaryIO) -> None:
        f.write(len(header).to_bytes(LENGTH_BYTES, "little") + header)
        if length:
            c.read_to(info["path"], f, 0, length, progress=lambda d, _t: advance(d))
    return write


def _to_stdout(write: Callable[[BinaryIO], None]) -> None:
    """`save NAME -`: the file's bytes on stdout (as `read NAME -`)."""
    import sys

    from .output import named_stdout
    out = sys.stdout.buffer
    try:
        write(out)
        out.flush()
    except OSError as exc:
        raise named_stdout(exc) from None
