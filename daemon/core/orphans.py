"""Start-up: which of the keeper's entries the registry cannot account for, and why.

The keeper (or systemd's fd store) holds memory under keys that are registry node ids. At
start some keys may name nothing in the registry. Two very different things look alike:

- crash-ordering residue (docs/durability.md, "Crash ordering"): a kill -9 between a deposit
  and its commit, or between a committed removal and its withdraw, leaves one such key. The
  registry is right; the memory was never handed out (or was already removed), so the start
  frees it, as it always did (logged at WARNING);
- a registry that is missing, replaced, or restored from an older backup while the keeper
  holds the allocations of the real one. Freeing those would destroy every durable
  allocation, so the start refuses (OrphansHeld) unless told what to do with them.

What tells them apart:
- identity: every deposit carries the registry's random `instance` id in its meta (the
  process keeper keeps meta; systemd's fd store does not, so there only the next two
  apply). An entry deposited for another instance is foreign;
- a registry created by this very start (there was none) lists nothing: everything the
  keeper holds is foreign;
- age: node ids come from AUTOINCREMENT, so a key above the registry's largest id was issued
  after the registry was last written. Residue leaves at most one such key (the one create
  that was in flight), so two or more mean the registry is older than what the keeper holds.
"""
from __future__ import annotations

import os

from gpumemctl.protocol import format_size

from .slabs import SLAB_KEY_BASE

ADOPT_FLAG = "--adopt-orphans"
FREE_FLAG = "--free-orphans"
POLICIES = ("refuse", "adopt", "free")
RECOVERY_DIR = "lost+found"      # at the root: re-registered orphans go in a dated directory


class OrphansHeld(Exception):
    """The keeper holds memory the registry does not list, and not as crash residue: the
    daemon must not start without an operator's choice (gpumemd exits 3)."""

    def __init__(self, count: int, nbytes: int, registry_path: str, why: str):
        self.count, self.nbytes, self.registry_path, self.why = count, nbytes, registry_path, why
        noun = "allocation" if count == 1 else "allocations"
        super().__init__(
            f"the keeper holds {count} {noun} ({format_size(nbytes)}) that registry "
            f"{registry_path} does not list ({why}): restore the registry, or start with "
            f"{ADOPT_FLAG} to re-register them under /{RECOVERY_DIR}/, or with {FREE_FLAG} to "
            "free their memory")


def classify(kept: dict[int, list[int]], metas: dict[int, dict] | None, listed: set[int],
             instance: str, created: bool, last_id: int) -> tuple[set[int], str]:
    """The keys of `kept` that are foreign (not residue of this registry), and why, in
    words for OrphansHeld ('' when none are). `metas`: each key's deposit meta, or None
    where the keeper keeps none; `listed`: the registry's allocation ids; `last_id`: its
    largest node id ever committed."""
    if not kept:
        return set(), ""
    if created:
        return set(kept), "it is new"
    reasons = []
    other = {k for k in kept if (metas or {}).get(k, {}).get("registry") not in (None, instance)}
    if other:
        reasons.append("they were deposited for another registry")
    newer = {k for k in set(kept) - other if k > last_id and k not in listed}
    if len(newer) < 2:
        newer = set()
    else:
        reasons.append("it is older than what the keeper holds")
    return other | newer, "; ".join(reasons)


def capacity_of(fds: list[int], meta: dict | None) -> int:
    """Bytes of the data an entry holds: the larger of its deposit meta's capacity and the
    data fd's size (a memfd grown in place by a resize may be larger than its meta says;
    a CUDA handle's fd tells nothing, 0)."""
    recorded = meta.get("capacity") if meta else None
    try:
        actual = os.fstat(fds[0]).st_size if fds else 0
    except OSError:
        actual = 0
    return max(recorded if isinstance(recorded, int) else 0, actual)


def held(kept: dict[int, list[int]], metas: dict[int, dict] | None,
         keys: set[int]) -> tuple[int, int]:
    """(allocations, bytes) that `keys` stand for: a resize's staged copy (-id) beside its
    committed one (id) counts once."""
    count = nbytes = 0
    for key in keys:
        if key < 0 and -key in keys:
            continue
        count += 1
        nbytes += capacity_of(kept[key], (metas or {}).get(key))
    return count, nbytes


def entry_name(key: int) -> str:
    """The name an orphan gets in the recovery directory: its old key ('12'), for a
    resize's staged copy '12.staged', and for a slab 'slab-3' (its bytes whole: which
    allocation had which slot was in the registry, docs/storage.md)."""
    if key >= SLAB_KEY_BASE:
        return f"slab-{key - SLAB_KEY_BASE}"
    return str(key) if key > 0 else f"{-key}.staged"
