"""The durable registry: SQLite in the state directory (docs/durability.md). All SQL of the
daemon lives in this package; the daemon's layers call it inside `Registry.transaction()`.

- schema.py: create_tables(), the current schema with the meaning of every column;
- migrations.py: MIGRATIONS, from each older version to the next;
- store.py: the Registry (connection, transactions and group commit, checkpoints), which
  composes one part per table section:
- nodes.py (`nodes`, `links`), metadata.py, damage.py, identity.py (`meta`, node ids),
  holders.py, eventlog.py (`events`, with the log's bounds);
- names.py: names and paths as TEXT or BLOB.

The names below are what the rest of the tree imports from `daemon.registry`.
"""
from __future__ import annotations

from .eventlog import EVENT_SHARE_PER_UID
from .names import loaded_name, stored_name
from .schema import ROOT_ID, SCHEMA_VERSION
from .store import GROUP_COMMIT_SECONDS, WAL_LIMIT, Registry, RegistryUnusable

__all__ = [
    "EVENT_SHARE_PER_UID", "GROUP_COMMIT_SECONDS", "ROOT_ID", "SCHEMA_VERSION", "WAL_LIMIT",
    "Registry", "RegistryUnusable", "loaded_name", "stored_name",
]
