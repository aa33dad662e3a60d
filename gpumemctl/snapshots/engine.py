"""Snapshots taken and restored by a client: `gpumemctl snapshot ...` (docs/snapshots.md).
This module names what the CLI calls: create.py takes them (striping.py writes their data),
restore.py brings them back, manage.py lists, verifies and removes them; catalog.py finds
them in a store, stores.py (dirstore.py, s3.py) is where they live.

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

What an incremental snapshot builds on, and where a lost allocation's entry is carried from,
is read only from snapshots the caller trusts (trust.py): others are passed over and named.
"""
from __future__ import annotations

from .catalog import split_location
from .create import create, select
from .manage import list_allocations, list_snapshots, remove, verify
from .restore import restore

__all__ = ["create", "list_allocations", "list_snapshots", "remove", "restore", "select",
           "split_location", "verify"]
