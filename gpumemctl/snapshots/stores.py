"""Where snapshots live: a directory (local disk, NFS, Lustre, 3FS: anything mounted) or an
S3-compatible bucket (gpumemctl/snapshots/s3.py). Both offer the same few calls, so the
engine (create.py, restore.py, manage.py) never knows which one it writes to.

A store's objects have keys `snap-.../manifest.json`, `snap-.../lock.json` and
`snap-.../data/<n>.bin` (gpumemctl/snapshots/manifest.py). Large objects are written in order
by an ObjectWriter and read back by byte range through an ObjectReader; small ones
(manifest, lock) whole. `put_atomic` is the commit point: readers see the old state or the
new one, never half of it.

The directory store writes what it makes private to its creator (directories 0700, files
0600): a snapshot holds the data of every allocation its creator could read. Share a store
across a fleet by granting access to it on purpose (docs/snapshots.md). Its root may be a
directory others can write (1777, a group's): below the root it reaches every file and
directory through directory descriptors, never by a path a swapped name could redirect
(gpumemctl/snapshots/dirfd.py), and with a `trust` (gpumemctl/snapshots/trust.py) it reads
only what a trusted uid owns.

This module opens a store; the directory store is dirstore.py (its files: dirio.py), the
object store s3.py, and both do their I/O on the threads of iopool.py.
"""
from __future__ import annotations

from .dirstore import DirStore
from .iopool import PIECE, io_pool

__all__ = ["PIECE", "DirStore", "io_pool", "open_store"]


def open_store(location: str, *, create: bool = False):
    """The store at `location`: `s3://bucket/prefix` or a directory path."""
    if location.startswith("s3://"):
        from .s3 import S3Store
        return S3Store(location)
    return DirStore(location, create=create)
