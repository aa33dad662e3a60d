"""The Registry composes one part per table section (registry.nodes, .links, .metadata,
.damaged, .identity, .holders, .event_log). The flat API of before the package is gone: callers
name the part (registry.nodes.update(...)), never a flat forward (issue 25)."""
from __future__ import annotations

import inspect

import pytest

from daemon.registry import ROOT_ID, Registry

# The registry's own public API: the connection, transactions, checkpoints.
OWN = {"version", "migrate", "enable_group_commit", "transaction", "savepoint",
       "deferring_sync", "sync_wal",
       "in_transaction", "flush",
       "wal_bytes", "checkpoint_due", "checkpoint", "integrity_errors",
       "integrity_errors_readonly", "close"}
PARTS = ("nodes", "links", "metadata", "damaged", "identity", "holders", "event_log")


@pytest.fixture
def reg(tmp_path):
    r = Registry(str(tmp_path / "r.sqlite"))
    yield r
    r.close()


def test_the_public_api_is_its_own_and_the_parts(reg):
    """No flat forwards left (issue 25): a caller names the part it changes."""
    public = {name for name, _ in inspect.getmembers(Registry) if not name.startswith("_")}
    assert public == OWN
    assert len(OWN) <= 25
    for part in PARTS:
        assert getattr(reg, part).__class__.__module__.startswith("daemon.registry.")


def test_the_parts_on_their_own(reg):
    """New code calls the parts: one change through them, read back through them."""
    with reg.transaction(durable=True):
        node = reg.nodes.insert(parent=ROOT_ID, name="w", kind="alloc", uid=0, gid=0,
                                mode=0o600, created_ns=0, modified_ns=0, changed_ns=0,
                                size=1, state="ready")
        reg.nodes.update(node, size=2)
        reg.links.insert(ROOT_ID, "w2", node)
        reg.metadata.set(node, b"k", b"v")
        reg.damaged.replace(node, {3}, 0)
        reg.holders.add(1, node, 1, "lease", 1, 0, 0)
        reg.identity.set("k", "v")
        reg.identity.reserve_node_ids(100)
        event = reg.event_log.add("create", node, "w", 0, 1, {}, 0)
    assert [n["size"] for n in reg.nodes.load()] == [None, 2]
    assert [link["name"] for link in reg.links.load()] == ["w2"]
    assert reg.metadata.load() == [(node, b"k", b"v")]
    assert reg.damaged.load() == {node: {3}}
    assert [h["node"] for h in reg.holders.load()] == [node]
    assert reg.identity.get("k") == "v" and reg.identity.next_node_id() == 101
    assert reg.event_log.last_id() == event == reg.event_log.query()[-1]["id"]
    assert reg.identity.instance == reg.identity.instance
