"""Model weights as zero-copy tensors: `gpumemctl.tensors.load(NAME)` (docs/tensors.md).

    import gpumemctl.tensors
    weights = gpumemctl.tensors.load("models/llama", framework="torch")   # {name: tensor}

An allocation made by `gpumemctl load` holds a safetensors file's tensor bytes at their
original offsets, and its metadata key `safetensors` holds the file's JSON header as it was
(gpumemctl/weights.py). `load` attaches the allocation (gpumemctl.attach: an fd passed by the
daemon, mapped into this process) and hands out views of the mapping, one per tensor, in the
framework asked for: nothing is copied. A directory made from a sharded model is one
allocation per shard; its tensors come back in one dict.

Lifetime: each attachment lives as long as any tensor from it does. The views share one
DLPack export of the whole allocation (per-tensor exports where the framework cannot slice
in place: JAX); when the last of them is freed the memory is unmapped and the daemon's holder
goes, whether or not the dict is still around. `mode="rw"` takes the one-writer lock: the
allocation is `unsealed` from the attach until `TensorDict.seal()` or the last tensor is
freed; a process that dies while holding them leaves it unsealed, and its bytes are kept.

The header is checked again here (the metadata may have been rewritten since `load`): every
tensor's dtype is known, its byte range holds exactly its shape and lies inside the
allocation. A bad index is a UsageError naming the allocation and the tensor; no view is
made past the mapping.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .protocol import UsageError

HEADER_KEY = "safetensors"              # an allocation's safetensors header, verbatim
INDEX_KEY = "safetensors.index"         # a directory's model.safetensors.index.json
FRAMEWORKS = ("torch", "cupy", "jax", "numpy")
MODES = ("r", "rw")

# Bits per element of every dtype the safetensors format names.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# The name of each dtype in numpy (with ml_dtypes for the ones numpy lacks), torch, cupy
# and jax.numpy; a dtype a framework has no name for cannot be loaded into it.
_NUMPY = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
          "F16": "float16", "I32": "int32", "U32": "uint32", "F32": "float32",
          "C64": "complex64", "F64": "float64", "I64": "int64", "U64": "uint64"}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
              "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz",
              "F8_E5M2FNUZ": "float8_e5m2fnuz"}
_TORCH = {**_NUMPY, "BF16": "bfloat16", "F8_E5M2": "float8_e5m2",
          "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
          "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}
_JAX = {**_NUMPY, **_ML_DTYPES}
_X64 = ("I64", "U64", "F64")      # jax keeps these only with jax_enable_x64


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the index: where its bytes are in which allocation."""
    name: str
    dtype: str              # as safetensors names it: "BF16", "F32", ...
    shape: tuple[int, ...]
    start: int              # byte range in the allocation, [start, end)
    end: int
    shard: str              # the allocation holding it

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class TensorIndex(Mapping):
    """The tensors of an allocation (or of a directory of shards), without mapping anything:
    `index["lm_head.weight"].shape`, `index.metadata` (the files' `__metadata__`),
    `index.shards` (allocation names), `index.nbytes`."""

    def __init__(self, name: str, tensors: dict[str, TensorInfo], metadata: dict[str, str],
                 shards: list[str]):
        self.name, self._tensors, self.metadata, self.shards = name, tensors, metadata, shards

    def __getitem__(self, key: str) -> TensorInfo:
        return self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tensors.values())

    def __repr__(self) -> str:
        return (f"<gpumemctl.tensors.TensorIndex {self.name!r}: {len(self)} tensors, "
                f"{self.nbytes} bytes in {len(self.shards)} allocation(s)>")


def parse_header(text: str, shard: str, size: int) -> tuple[dict[str, TensorInfo], dict]:
    """The tensors named by a stored safetensors header, each checked against the
    allocation's `size`. The format itself was checked by the safetensors library when the
    file was loaded; this only refuses what would make a view unsafe or wrong."""
    def bad(problem: str) -> UsageError:
        return UsageError(f"'{shard}': its tensor index (metadata key {HEADER_KEY!r}) "
                          f"{problem}")

    try:
        header = json.loads(text)
    except ValueError as exc:
        raise bad(f"is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad("is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise bad("has a __metadata__ that is not an object")
    tensors = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(name, entry, shard, size, bad)
    return tensors, meta


def _tensor_info(name: str, entry: Any, shard: str, size: int, bad) -> TensorInfo:
    if not isinstance(entry, dict):
        raise bad(f"has tensor {name!r} that is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise bad(f"has tensor {name!r} of unknown dtype {dtype!r} (known: "
                  f"{', '.join(DTYPE_BITS)})")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise bad(f"has tensor {name!r} whose shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise bad(f"has tensor {name!r} whose data_offsets {offsets!r} are not [start, end]")
    start, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != end - start:
        raise bad(f"has tensor {name!r}: {dtype} {shape} takes {bits / 8:g} bytes, but its "
                  f"range [{start}, {end}) holds {end - start}")
    if end > size:
        raise bad(f"has tensor {name!r} whose range [{start}, {end}) runs past the end of "
                  f"the allocation ({size} bytes)")
    return TensorInfo(name, dtype, tuple(shape), start, end, shard)


# ---- open: the index ------------------------------------------------------------------------
def open(name: str, *, socket: str | None = None, client=None) -> TensorIndex:
    """The tensor index of allocation (or directory of shards) `name`, mapping nothing."""
    with _client(socket, client) as c:
        shards = _shard_infos(c, name)
    return _index(name, shards)


def _index(name: str, infos: list[dict]) -> TensorIndex:
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, str] = {}
    for info in infos:
        found, meta = parse_header(_header_of(info), info["path"], info.get("size") or 0)
        for key, t in found.items():
            if key in tensors:
                raise UsageError(f"'{name}': tensor {key!r} is in both "
                                 f"'{tensors[key].shard}' and '{t.shard}'")
            tensors[key] = t
        metadata.update(meta)
    return TensorIndex(name, tensors, metadata, [i["path"] for i in infos])


def _header_of(info: dict) -> str:
    header = (info.get("metadata") or {}).get(HEADER_KEY)
    if header is None:
        raise UsageError(f"'{info['path']}' holds no tensors: it has no metadata key "
                         f"{HEADER_KEY!r} (make it with `gpumemctl load`)")
    return header


def _shard_infos(c, name: str) -> list[dict]:
    """info of `name`, or of every allocation with a tensor index under directory `name`
    (recursively, in name order)."""
    info = c.info(name)
    if info.get("type", "allocation") != "directory":
        return [info]
    entries = c.ls(name, recursive=True)
    paths = sorted(e["path"] for e in entries if e.get("type", "allocation") == "allocation")
    infos = [c.info(p) for p in paths]
    infos = [i for i in infos if HEADER_KEY in (i.get("metadata") or {})]
    if not infos:
        raise UsageError(f"'{name}' is a directory with no allocation made by "
                         "`gpumemctl load` in it")
    return infos


class _client:
    """The caller's Client, or one of our own for the duration of a `with`."""

    def __init__(self, socket: str | None, client):
        self.given, self.socket = client, socket
        self.own: Any = None

    def __enter__(self):
        if self.given is not None:
            return self.given
        from .client import Client
        self.own = Client(self.socket, client_name="gpumemctl.tensors")
        return self.own

    def __exit__(self, *exc) -> None:
        if self.own is not None:
            self.own.close()


# ---- load: the tensors ------------------------------------------------------------------------
class TensorDict(dict):
    """A dict of tensor name -> zero-copy tensor, with what it came from: `.index` (the
    TensorIndex), `.attachments` (one gpumemctl.Attachment per shard), `.sleep()` and
    `.wake()`, and, for `mode="rw"`, `.seal()`."""

    index: TensorIndex
    attachments: list

    def seal(self) -> None:
        """Declare the in-place updates complete: every shard is sealed again (its parity
        brought up to date); the tensors stay usable and the lock stays held."""
        for a in self.attachments:
            a.seal()

    def sleep(self) -> list:
        """Put every shard to sleep (gpumemctl/sleepwake.py): the tensors keep their
        addresses but must not be touched until wake(). Client.sleep's answers."""
        return self._each_shard("sleep")

    def wake(self) -> list:
        """Wake every shard: the tensors see the same values at the same addresses."""
        return self._each_shard("wake")

    def _each_shard(self, op: str) -> list:
        if not self.attachments:
            return []
        from .client import Client
        with Client(self.attachments[0].socket_path, client_name="gpumemctl.tensors") as c:
            return getattr(c, op)([a.name for a in self.attachments])


def load(name: str, framework: str = "torch", mode: str = "r", *,
         socket: str | None = None, client=None) -> TensorDict:
    """Zero-copy tensors of allocation (or directory of shards) `name`: torch, cupy or jax
    on the allocation's GPU; numpy (or torch on the CPU) on the host backend."""
    if framework not in FRAMEWORKS:
        raise UsageError(f"invalid framework {framework!r}: expected one of "
                         f"{', '.join(FRAMEWORKS)}")
    if mode not in MODES:
        raise UsageError(f"invalid mode {mode!r}: expected one of {', '.join(MODES)}")
    from .attach import SharedClient, attach
    from .client import Client
    # One connection for the listing and every shard's attach (unless the caller gave one):
    # each attachment keeps a share of it for as long as a tensor of it lives.
    conn = client if client is not None else \
        SharedClient(Client(socket, client_name="gpumemctl.tensors"))
    out = TensorDict()
    out.attachments = []
    infos = []
    try:
        shards = _shard_infos(conn, name)
        for shard in shards:
            # The index is the one the attach answered with: that of the memory attached,
            # whatever changed since.
            a = attach(shard["path"], mode, socket, client=conn)
            out.attachments.append(a)
            infos.append(a.info)
        out.index = _index(name, infos)
        by_shard: dict[str, list[TensorInfo]] = {}
        for t in out.index.values():
            by_shard.setdefault(t.shard, []).append(t)
        for a in out.attachments:
            out.update(_views(a, by_shard.get(a.name, []), framework))
    except BaseException:
        out.clear()
        for a in out.attachments:
            a.detach(seal=False)
        raise
    finally:
        if client is None:
            conn.close()         # our share: the attachments keep theirs
    for a in out.attachments:
        a.detach(seal=False)     # done when the last tensor is freed (module docstring)
    return out


def _views(a, tensors: list[TensorInfo], framework: str) -> dict:
    if framework == "jax":
        return _jax_views(a, tensors)
    if framework == "numpy" and a.backend == "cuda":
        raise UsageError(f"'{a.name}' is GPU memory: numpy cannot hold it in place; use "
                         "framework torch, cupy or jax")
    if framework == "cupy" and a.backend != "cuda":
        raise UsageError(f"'{a.name}' is host memory (the host backend): cupy holds GPU "
                         "memory only; use numpy or torch")
    mod, names = _framework(framework)
    dtypes = {t.dtype: _dtype(mod, names, t, framework, a.name) for t in tensors}
    if not tensors:
        return {}
    # One counted export: uint8, the whole allocation. torch gets the classic capsule
    # (it may refuse a versioned one's read-only flag); numpy and cupy ask themselves.
    base = mod.from_dlpack(a.__dlpack__() if framework == "torch" else a)
    views = {}
    for t in tensors:
        piece = base[t.start:t.end]
        if framework == "torch":
            views[t.name] = _torch_view(piece, dtypes[t.dtype], t)
        else:
            views[t.name] = piece.view(dtypes[t.dtype]).reshape(t.shape)
    return views


def _torch_view(piece, dtype, t: TensorInfo):
    try:
        return piece.view(dtype).view(t.shape)
    except RuntimeError as exc:      # a range not aligned to the element size
        raise UsageError(f"'{t.shard}': tensor {t.name!r} starts at byte {t.start}, not a "
                         f"multiple of its element size: torch cannot view it in place "
                         f"({exc})") from None


def _framework(framework: str):
    import importlib
    try:
        mod = importlib.import_module(framework)
    except ImportError:
        raise UsageError(f"framework {framework!r} is not installed in this Python") from None
    names = {"torch": _TORCH, "numpy": _NUMPY, "cupy": _NUMPY}[framework]
    return mod, names


def _dtype(mod, names: dict, t: TensorInfo, framework: str, shard: str):
    name = names.get(t.dtype)
    found = getattr(mod, name, None) if name else None
    if found is None and framework == "numpy" and t.dtype in _ML_DTYPES:
        try:
            import ml_dtypes
            found = getattr(ml_dtypes, _ML_DTYPES[t.dtype], None)
        except ImportError:
            pass
    if found is None:
        hint = " (install ml_dtypes)" if framework == "numpy" and t.dtype in _ML_DTYPES else ""
        raise UsageError(f"'{shard}': tensor {t.name!r} has dtype {t.dtype}, which "
                         f"{framework} cannot hold{hint}")
    return found


def _jax_views(a, tensors: list[TensorInfo]) -> dict:
    """JAX cannot slice an array in place, so each tensor is its own DLPack export."""
    import jax
    import jax.numpy as jnp
    from jax import dlpack as jax_dlpack

    from . import dlpack
    views = {}
    for t in tensors:
        dtype = getattr(jnp, _JAX.get(t.dtype, ""), None)
        if dtype is None:
            raise UsageError(f"'{a.name}': tensor {t.name!r} has dtype {t.dtype}, which jax "
                             "cannot hold")
        if t.dtype in _X64 and not jax.config.read("jax_enable_x64"):
            # jax would make a 32-bit copy: neither in place nor the same values
            raise UsageError(f"'{a.name}': tensor {t.name!r} is {t.dtype}, which jax holds "
                             "only with jax_enable_x64 on (jax.config.update("
                             "'jax_enable_x64', True))")
        code, bits = dlpack.dtype_code(jnp.dtype(dtype))
        export = a.export(t.start, t.nbytes, (code, bits), t.shape)
        views[t.name] = jax_dlpack.from_dlpack(export)
    return views
