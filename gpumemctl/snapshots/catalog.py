"""Which snapshots of a store a command may use: naming a store or one snapshot in it,
reading a manifest, and the trusted complete snapshots newest first (docs/snapshots.md;
trust.py says whose files are trusted)."""
from __future__ import annotations

from collections.abc import Iterator

from ..protocol import GpumemError, NotFound, PermissionDenied
from . import manifest as fmt
from .manifest import SnapshotDamaged
from .trust import Trust


def split_location(location: str) -> tuple[str, str | None]:
    """`DEST` or `DEST/snap-...`: the store's location and the snapshot named, if any."""
    fmt.check_location(location)
    head, _, last = location.rstrip("/").rpartition("/")
    if fmt.NAME_RE.fullmatch(last):
        return (head or "."), last
    return location, None


def load_manifest(store, name: str, trust: Trust | None = None) -> dict:
    """A snapshot's manifest, checked (manifest.parse); with `trust`, read only where a
    trusted uid owns the snapshot's directory and its manifest (Untrusted: exit 6)."""
    raw = store.read(f"{name}/{fmt.MANIFEST}", fmt.MAX_MANIFEST, trust)
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


class Sources:
    """The complete snapshots of a store a command may read, newest first, each manifest
    read once and only when asked for: one with no manifest (partial, retired) is skipped;
    one that is not trusted, or whose manifest is damaged, is passed over and listed in
    `passed` ({snapshot, code, message}) for the command to report."""

    def __init__(self, store, trust: Trust):
        self.store, self.trust = store, trust
        self.passed: list[dict] = []
        self._names = list(reversed(store.names()))
        self._loaded: list[tuple[str, dict]] = []

    def each(self) -> Iterator[tuple[str, dict]]:
        """(name, manifest) of each trusted complete snapshot, newest first."""
        yield from self._loaded
        while self._names:
            name = self._names.pop(0)
            found = self._load(name)
            if found is not None:
                self._loaded.append((name, found))
                yield name, found

    def newest(self) -> tuple[str, dict] | None:
        return next(self.each(), None)

    def _load(self, name: str) -> dict | None:
        if not self.store.exists(f"{name}/{fmt.MANIFEST}"):
            return None                     # partial or retired: nothing to pass over
        try:
            return load_manifest(self.store, name, self.trust)
        except NotFound:
            return None
        except (PermissionDenied, SnapshotDamaged) as exc:     # Untrusted, or unreadable
            self.passed.append(_passed(name, exc))
            return None


def _passed(name: str, exc: GpumemError) -> dict:
    return {"snapshot": name, "code": exc.code, "reason": exc.name, "message": str(exc)}
