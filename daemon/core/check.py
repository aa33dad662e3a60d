"""`check`: an fsck for gpumemd. Registry <-> in-memory tree <-> backend <-> keeper.

One small `check_*` method per invariant. While the daemon runs, the in-memory tree is the
truth (it holds the actual memory), so repairs bring the registry and the keeper in line with
it. Each problem is reported whether or not it was repaired.
"""
from __future__ import annotations

import contextlib

from ..backends.arenas import is_span
from ..backends.slabs import Slot, placement
from ..keeper.link import KeeperGone
from ..registry import Registry, stored_name
from .arenas import ARENA_KEY_BASE
from .custody import Custody
from .holders import MOUNT_KINDS
from .namespace import Namespace
from .nodes import Allocation, kind_of
from .slabs import SLAB_KEY_BASE

# Registry columns compared with the in-memory node; (column, attribute, to-db conversion).
_FIELDS = [("name", "name", None), ("uid", "uid", None), ("gid", "gid", None),
           ("mode", "mode", None), ("size", "size", None), ("capacity", "capacity", None),
           ("device", "device", None), ("durable", "durable", int),
           ("state", "stored_state", None), ("asleep", "asleep", int),
           ("ecc", "ecc", None), ("target", "target", stored_name), ("rdev", "rdev", None)]


class Checker:
    """Made by the `check` verb (daemon/verbs/checks.py): the namespace for the in-memory
    side, the registry's methods (the database layer) for its side and its repairs, the
    keeper's; custody re-deposits what the keeper lacks."""

    def __init__(self, namespace: Namespace, custody: Custody, registry: Registry, keeper):
        self.ns, self.custody = namespace, custody
        self.registry, self.keeper = registry, keeper
        self.problems: list[dict] = []
        self.repair = False
        self.integrity_errors: list[str] | None = None

    def run(self, *, repair: bool = False, integrity_errors: list[str] | None = None) -> dict:
        """Every check_* in turn. `integrity_errors`: SQLite's integrity check made already
        (off the event loop: it reads the whole file); None runs it here."""
        self.repair = repair
        self.integrity_errors = integrity_errors
        checks = [name for name in dir(self) if name.startswith("check_")]
        for name in checks:
            getattr(self, name)()
        return {"clean": not self.problems, "checks": [c[6:] for c in checks],
                "problems": self.problems, "repaired": repair}

    def _problem(self, check: str, message: str, fix=None) -> None:
        repaired = False
        if self.repair and fix is not None:
            fix()
            repaired = True
        self.problems.append({"check": check, "message": message, "repaired": repaired})

    # ---- invariants -------------------------------------------------------------------
    def check_registry_integrity(self) -> None:
        errors = self.integrity_errors
        for line in self.registry.integrity_errors() if errors is None else errors:
            self._problem("registry_integrity", f"SQLite integrity: {line}")

    def check_registry_rows_match_tree(self) -> None:
        rows = {r["id"]: r for r in self.registry.nodes.load()}
        reg = self.registry
        for node in self.ns.all_nodes():
            node_id = node.id
            row = rows.pop(node_id, None)
            if row is None:
                self._problem("registry_rows", f"'{node.path}' (id {node_id}) has no registry "
                              "row", lambda n=node: self._rewrite_row(n, insert=True))
                continue
            parent_id = node.parent.id if node.parent else None
            diffs = [col for col, attr, conv in _FIELDS
                     if hasattr(node, attr) and row[col] != (conv(getattr(node, attr))
                                                            if conv else getattr(node, attr))]
            if row["parent"] != parent_id:
                diffs.append("parent")
            if diffs:
                self._problem("registry_rows", f"'{node.path}' (id {node_id}): registry "
                              f"differs in {', '.join(diffs)}",
                              lambda n=node: self._rewrite_row(n))
        for node_id, row in rows.items():
            self._problem("registry_rows", f"registry row {node_id} ('{row['name']}') "
                          "names nothing the daemon holds",
                          lambda i=node_id: reg.nodes.delete(i))

    def _rewrite_row(self, node, insert: bool = False) -> None:
        fields = {col: (conv(getattr(node, attr)) if conv else getattr(node, attr))
                  for col, attr, conv in _FIELDS if hasattr(node, attr)}
        fields["parent"] = node.parent.id if node.parent else None
        with self.registry.transaction(durable=True):
            if insert:
                self.registry.nodes.insert(
                    id=node.id, kind=kind_of(node),
                    created_ns=node.created_ns, modified_ns=node.modified_ns,
                    changed_ns=node.changed_ns, name=node.name, uid=node.uid, gid=node.gid,
                    mode=node.mode)
            self.registry.nodes.update(node.id, **fields)

    def check_hard_links(self) -> None:
        """The `links` table holds exactly the names beyond the first that the tree has,
        and each is in its directory."""
        rows = {(r["parent"], r["name"]): r["node"] for r in self.registry.links.load()}
        live = {(d.id, name): node.id for node in self.ns.all_nodes()
                for d, name in node.aliases}
        for node in self.ns.all_nodes():
            for d, name in node.aliases:
                if d.children.get(name) is not node:
                    self._problem("links", f"hard link '{name}' of '{node.path}' (id "
                                  f"{node.id}) is not listed in its directory")
        if rows != live:
            wrong = sorted(set(rows.items()) ^ set(live.items()), key=repr)
            self._problem("links", f"registry's hard links differ from the daemon's in "
                          f"{len(wrong)} names, e.g. {wrong[:3]}",
                          lambda: self._rewrite_links(rows, live))

    def _rewrite_links(self, rows: dict, live: dict) -> None:
        with self.registry.transaction(durable=True):
            for parent_id, name in rows:
                self.registry.links.delete(parent_id, name)
            for (parent_id, name), node_id in live.items():
                self.registry.links.insert(parent_id, name, node_id)

    def check_user_metadata(self) -> None:
        """The registry's `metadata` rows are the user metadata the tree's nodes hold: none
        of a node the tree lacks (ON DELETE CASCADE sees to that), none missing or
        different. A repair writes the tree's into the registry."""
        rows: dict[int, dict[bytes, bytes]] = {}
        for node_id, key, value in self.registry.metadata.load():
            rows.setdefault(node_id, {})[key] = value
        live = {n.id: n.metadata for n in self.ns.all_nodes() if n.metadata}
        for node_id in sorted(set(rows) | set(live)):
            if rows.get(node_id, {}) == live.get(node_id, {}):
                continue
            node = self.ns.node_or_none(node_id)
            what = f"'{node.path}' (id {node_id})" if node is not None else \
                f"node {node_id}, which the daemon does not hold,"
            wanted = live.get(node_id, {})
            self._problem("metadata", f"the registry's user metadata of {what} differs from "
                          "the daemon's",
                          lambda i=node_id, m=wanted: self._rewrite_metadata(i, m))

    def _rewrite_metadata(self, node_id: int, metadata: dict[bytes, bytes]) -> None:
        with self.registry.transaction(durable=True):
            self.registry.metadata.delete(node_id)
            for key, value in metadata.items():
                self.registry.metadata.set(node_id, key, value)

    def check_backend_memory(self) -> None:
        for alloc in self.ns.allocations():
            has_memory = alloc.state in ("ready", "degraded")
            if has_memory and alloc.buffer is None:
                self._problem("backend_memory", f"'{alloc.path}' is {alloc.state} but holds "
                              "no memory")
            elif alloc.buffer is not None and alloc.buffer.capacity != alloc.capacity:
                self._problem("backend_memory", f"'{alloc.path}': backend holds "
                              f"{alloc.buffer.capacity} bytes, registry says {alloc.capacity}")
            if alloc.size is not None and alloc.capacity is not None and \
                    alloc.size > alloc.capacity:
                self._problem("backend_memory", f"'{alloc.path}': size {alloc.size} exceeds "
                              f"capacity {alloc.capacity}")

    def check_keeper_holds_durable(self) -> None:
        try:
            kept = set(self.keeper.keys())
        except KeeperGone as exc:
            self._problem("keeper", f"keeper unreachable: {exc}")
            return
        wanted = {a.id: a for a in self.ns.allocations()
                  if a.kept and not isinstance(a.buffer, Slot)}
        tiers = {-a.id: a for a in self.ns.allocations() if a.asleep and a.durable}
        for key in sorted(set(tiers) - kept):
            self._problem("keeper", f"asleep durable '{tiers[key].path}' (id {-key}): the "
                          "keeper holds no host copy of it: a daemon crash now would lose "
                          "it (a keeper restart hands it over again)")
        kept -= set(tiers)
        kept -= {SLAB_KEY_BASE + slab_id for slab_id in self.custody.backend.pool.slabs}
        kept -= self.custody.arenas.keys()        # check_parity_arenas says more
        for key in sorted(set(wanted) - kept):
            self._problem("keeper", f"durable '{wanted[key].path}' (id {key}) is not held by "
                          "the keeper: a daemon crash now would lose it",
                          lambda a=wanted[key]: self.custody.deposit(a))
        for key in sorted(kept - set(wanted)):
            self._problem("keeper", f"the keeper holds memory under id {key}, which is no "
                          "durable allocation", lambda k=key: self._withdraw(k))

    def check_slabs(self) -> None:
        """Every slab in memory has its row and the keeper holds it; every allocation in a
        slot has its slab and offset in its row, in bounds, of its class (docs/storage.md).
        Repairs write the daemon's placement into the row."""
        slabs = self.custody.backend.pool.slabs
        rows = {r["id"]: r for r in self.registry.slabs.load()}
        for slab_id in sorted(set(slabs) - set(rows)):
            self._problem("slabs", f"slab {slab_id} is held but has no registry row")
        try:
            kept = set(self.keeper.keys())
        except KeeperGone:
            kept = None                      # check_keeper_holds_durable says so
        for slab_id in sorted(slabs):
            if kept is not None and SLAB_KEY_BASE + slab_id not in kept:
                self._problem("slabs", f"the keeper does not hold slab {slab_id}: a daemon "
                              "crash now would lose its durable allocations",
                              self.custody.slabs.redeposit_all)
        placed = self.registry.slabs.placements()
        for alloc in self.ns.allocations():
            buf = alloc.buffer
            want = (buf.slab.id, buf.offset) if isinstance(buf, Slot) else None
            if placed.get(alloc.id) != want:
                self._problem("slabs", f"'{alloc.path}' (id {alloc.id}) is at "
                              f"{want or 'memory of its own'}, its row says "
                              f"{placed.get(alloc.id) or 'memory of its own'}",
                              lambda a=alloc: self._rewrite_placement(a))
            if isinstance(buf, Slot) and (buf.slab.used.get(buf.offset) is not buf or
                                          not buf.slab.fits(buf.offset)):
                self._problem("slabs", f"'{alloc.path}' (id {alloc.id}) is not a used slot "
                              f"of slab {buf.slab.id} at offset {buf.offset}")

    def check_parity_arenas(self) -> None:
        """Every parity arena in memory has its row and the keeper holds it; every slab and
        kept allocation whose parity is a span has that span in its row (a restart finds
        its parity there: docs/storage.md, "Parity arenas"). Repairs deposit the arenas
        again and write the rows."""
        arenas = self.custody.arenas
        rows = self.registry.arenas.ids()
        for arena_id in sorted(set(arenas.pool.arenas) - rows):
            self._problem("parity_arenas", f"parity arena {arena_id} is held but has no "
                          "registry row")
        try:
            kept = set(self.keeper.keys())
        except KeeperGone:
            kept = None                      # check_keeper_holds_durable says so
        if kept is not None and arenas.keys() - kept:
            self._problem("parity_arenas", "the keeper does not hold parity arenas "
                          f"{sorted(k - ARENA_KEY_BASE for k in arenas.keys() - kept)}: a "
                          "daemon crash now would lose their parity", arenas.redeposit_all)
        spans = self.registry.arenas.spans()
        for alloc in self.ns.allocations():
            span = alloc.parity
            if alloc.kept and is_span(span) and not isinstance(alloc.buffer, Slot) and \
                    spans.get(alloc.id) != span.where and alloc.id not in arenas.owed:
                self._problem("parity_arenas", f"'{alloc.path}' (id {alloc.id}) has its "
                              f"parity at {span.where} (arena, offset, bytes), its row says "
                              f"{spans.get(alloc.id)}", lambda a=alloc: self._rewrite_span(a))
        slab_rows = {r["id"]: r for r in self.registry.slabs.load()}
        for slab in self.custody.backend.pool.slabs.values():
            row = slab_rows.get(slab.id)
            if row is not None and is_span(slab.parity) and \
                    (row["parity_arena"], row["parity_offset"]) != \
                    (slab.parity.arena.id, slab.parity.offset):
                self._problem("parity_arenas", f"slab {slab.id} has its parity at "
                              f"{(slab.parity.arena.id, slab.parity.offset)}, its row says "
                              f"{(row['parity_arena'], row['parity_offset'])}")

    def _rewrite_span(self, alloc: Allocation) -> None:
        with self.registry.transaction(durable=True):
            self.custody.arenas.note(alloc)

    def _rewrite_placement(self, alloc: Allocation) -> None:
        with self.registry.transaction(durable=True):
            self.registry.nodes.update(alloc.id, **placement(alloc.buffer))

    def _withdraw(self, key: int) -> None:
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)

    def check_holders_table(self) -> None:
        """The holders table lists exactly the holders that have rows: every one but the
        files open on the mount, which never get one (Holders.add)."""
        rows = {r["id"]: r for r in self.registry.holders.load()}
        live = self._recorded_holders()
        if set(rows) != set(live):
            self._problem("holders", f"holders table lists {sorted(rows)}, the daemon has "
                          f"{sorted(live)}", self._rewrite_holders)

    def _recorded_holders(self) -> dict:
        return {h.id: h for a in self.ns.allocations() for h in a.holders.values()
                if h.kind not in MOUNT_KINDS}

    def _rewrite_holders(self) -> None:
        with self.registry.transaction(durable=False):
            self.registry.holders.clear()
            for h in self._recorded_holders().values():
                self.registry.holders.add(h.id, h.alloc.id, h.session.id, h.kind, h.pid,
                                         h.uid, h.since_ns)

    def check_tree_shape(self) -> None:
        for node in self.ns.all_nodes():
            if node.parent is None and node is not self.ns.root:
                self._problem("tree", f"node {node.id} ('{node.name}') has no parent")
            elif node.parent is not None and node.parent.children.get(node.name) is not node:
                self._problem("tree", f"'{node.path}' is not listed in its directory")
            if isinstance(node, Allocation) and node.unlinked:
                self._problem("tree", f"'{node.path}' is unlinked but still named")
