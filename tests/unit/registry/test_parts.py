"""The Registry composes one part per table section (registry.nodes, .links, .metadata,
.damaged, .identity, .holders, .event_log). Its flat API of before the package forwards to
them while callers move (issue 25): each forward passes every argument and the answer."""
from __future__ import annotations

import inspect

import pytest

from daemon.registry import ROOT_ID, Registry

# The registry's own public API: the connection, transactions, checkpoints.
OWN = {"version", "migrate", "enable_group_commit", "transaction", "in_transaction", "flush",
       "wal_bytes", "checkpoint_due", "checkpoint", "integrity_errors",
       "integrity_errors_readonly", "close"}
# forward: (part, its method, the positional arguments of a call[, its keywords])
FORWARDS: dict[str, tuple] = {
    "load_nodes": ("nodes", "load", ()),
    "insert_node": ("nodes", "insert", (), {"name": "a", "kind": "dir"}),
    "update_node": ("nodes", "update", (2,), {"name": "b"}),
    "delete_node": ("nodes", "delete", (2,)),
    "load_links": ("links", "load", ()),
    "insert_link": ("links", "insert", (1, "a", 2)),
    "delete_link": ("links", "delete", (1, "a")),
    "load_metadata": ("metadata", "load", ()),
    "set_metadata": ("metadata", "set", (2, b"k", b"v")),
    "delete_metadata": ("metadata", "delete", (2, b"k")),
    "damage": ("damaged", "load", ()),
    "set_damage": ("damaged", "replace", (2, {1}, 3)),
    "last_node_id": ("identity", "last_node_id", ()),
    "reserve_node_ids": ("identity", "reserve_node_ids", (9,)),
    "next_node_id": ("identity", "next_node_id", ()),
    "set_meta": ("identity", "set", ("k", "v")),
    "meta": ("identity", "get", ("k",)),
    "add_holder": ("holders", "add", (1, 2, 3, "lease", 4, 5, 6)),
    "remove_holder": ("holders", "remove", (1,)),
    "clear_holders": ("holders", "clear", ()),
    "load_holders": ("holders", "load", ()),
    "add_event": ("event_log", "add", ("k", 2, "p", 3, 4, {"d": 1}, 5)),
    "event_log_bytes": ("event_log", "size_bytes", ()),
    "last_snapshot_reports": ("event_log", "last_snapshot_reports", (bool,)),
    "last_event_id": ("event_log", "last_id", ()),
    "events": ("event_log", "query", (1, 2, "p", 3)),
    "events_page": ("event_log", "page", (1, 2, "p", 3, 4, True)),
}
PROPERTIES = {"instance": ("identity", "instance")}


@pytest.fixture
def reg(tmp_path):
    r = Registry(str(tmp_path / "r.sqlite"))
    yield r
    r.close()


def test_the_public_api_is_its_own_and_the_forwards():
    public = {name for name, _ in inspect.getmembers(Registry) if not name.startswith("_")}
    assert public == OWN | set(FORWARDS) | set(PROPERTIES)
    assert len(OWN) <= 25


@pytest.mark.parametrize("forward", sorted(FORWARDS))
def test_each_forward_passes_its_call_to_its_part(reg, monkeypatch, forward):
    part, method, args, *keywords = FORWARDS[forward]
    kwargs = keywords[0] if keywords else {}
    calls = []
    answer = object()

    def record(*a, **kw):
        calls.append((a, kw))
        return answer

    monkeypatch.setattr(getattr(reg, part), method, record)
    got = getattr(reg, forward)(*args, **kwargs)
    assert calls == [(args, kwargs)]
    if got is not None:
        assert got is answer


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
    assert reg.identity.instance == reg.instance
