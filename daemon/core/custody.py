"""Custody: who holds the memory, in what order. The backend allocates and frees; the
keeper holds the fds of durable allocations across daemon crashes (daemon/keeper_link.py).

The orders that make a kill -9 anywhere safe (docs/durability.md, "Crash ordering"):
- create durable: allocate, deposit the fds in the keeper, commit the registry row. A crash
  before the commit leaves fds in the keeper under an id the registry does not know: the
  next start frees them as orphans.
- remove durable: commit the deletion, withdraw from the keeper, free. A crash after the
  commit again leaves an orphan for the next start to free.
- resize durable (a new buffer): stage the new fds under -id, commit, deposit under id,
  withdraw -id (reallocate); start-up adopts whichever copy has the committed capacity.
- registry says durable but the keeper has nothing (reboot, GPU reset, keeper killed while
  the daemon was down): the allocation is `lost`, and stays listed until removed.
Transient allocations never outlive the daemon; their rows are dropped at the next start.

Commits are the caller's: the verbs that need one here take it as a callable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable

from gpumemctl.protocol import Busy, InternalError, InvalidState, NoMemory, round_up

from ..backends import Backend
from ..ecc.layout import BLOCK
from ..keeper.link import FdStoreFull, KeeperGone, KeeperStalled
from ..registry import Registry
from .fdbudget import FdBudget, fds_for
from .journal import Journal
from .namespace import DAEMON, Namespace
from .nodes import WRITER_KINDS, Allocation, Directory
from .orphans import POLICIES, OrphansHeld, capacity_of, classify, entry_name, held
from .parity import Parity
from .permissions import Credentials

log = logging.getLogger("gpumemd")


@dataclasses.dataclass
class Deposit:
    """fds on their way to the keeper under `key`; `what` names the change for errors."""
    key: int
    what: str
    fds: list[int]
    meta: dict
    source: tuple[object, object] | None = None     # the (buffer, parity) of the fds

    def taken_from(self, alloc: Allocation) -> bool:
        """Whether the fds are still `alloc`'s memory (the objects: ids are reused)."""
        return self.source is not None and self.source[0] is alloc.buffer and \
            self.source[1] is alloc.parity


@dataclasses.dataclass
class Prepared:
    """A durable allocation's memory made before its row (prepare): the allocation, outside
    the tree, under a reserved id, and the ids reserved for its missing parent directories
    (so that parents keep smaller ids than their children)."""
    alloc: Allocation
    dir_ids: list[int]


class Custody:
    def __init__(self, registry: Registry, journal: Journal, backend: Backend, keeper,
                 namespace: Namespace, parity: Parity):
        self.registry = registry
        self.journal = journal
        self.backend = backend
        self.keeper = keeper
        self.ns = namespace
        self.parity = parity
        self.fds: FdBudget | None = None      # gpumemd's descriptor budget (main.py sets it)

    # ---- start-up: what the keeper holds against what the registry lists -------------------
    def reconcile_at_start(self, orphans: str,
                           settle: Callable[[list[Allocation], dict[int, set[int]],
                                             Callable[[Allocation], None]], int]) -> dict:
        """Re-adopt durable memory from the keeper, drop what is stale (the namespace is
        loaded). Keeper entries the registry does not list are crash residue and are freed,
        unless daemon/orphans.py finds them foreign (the registry is new, another one, or
        older than the keeper's contents). Then `orphans` decides: 'refuse' raises
        OrphansHeld having changed nothing; 'adopt' re-registers every unlisted entry under
        /lost+found/<time>; 'free' frees them all. `settle`: Integrity.settle, which gives
        the adopted allocations their parity. Returns the summary the `start` event logs."""
        self.keeper.ensure_running()
        kept = self.keeper.fetch_all()
        metas = self.keeper.entries()
        strays = self.take_strays(kept, metas, orphans)
        summary = {"adopted": 0, "lost": 0, "orphans_freed": 0, "orphans_adopted": 0,
                   "transients_dropped": 0}
        damage = self.registry.damaged.load()
        recovered: dict[int, list[int]] = {}
        with self.journal.change(durable=True):
            interrupted = [r for r in self.registry.holders.load()
                           if r["kind"] in WRITER_KINDS]
            self.registry.holders.clear()
            if kept or strays:      # no new id may alias a key the keeper holds
                self.ns.reserve_ids_up_to(max(abs(k) for k in [*kept, *strays]))
            self._adopt_listed(kept, summary)
            for key, fds in kept.items():
                self.free_orphan(key, fds)
                summary["orphans_freed"] += 1
            if orphans == "adopt":
                recovered = self.adopt_orphans(strays, metas, summary)
            else:
                for key, fds in strays.items():
                    self.free_orphan(key, fds, "freed as told (--free-orphans)")
                    summary["orphans_freed"] += 1
            summary["parity_rebuilt_blocks"] = settle(self.ns.allocations(), damage,
                                                      self.deposit)
            self._note_interrupted_writers(interrupted)
            self.journal.event("start", None, None, backend=self.backend.name, **summary)
        for key in recovered:       # committed under new ids: the old keys may go now
            with contextlib.suppress(KeeperGone):
                self.keeper.withdraw(key)
        self.adopt_identity(metas)
        return summary

    def _note_interrupted_writers(self, rows) -> None:
        """A writer (a socket `open rw`, an `attach rw`) still held its allocation when the
        daemon stopped: its writes landed in memory the keeper kept, but its `close` never
        came. Record what can be known: the allocation was modified (now), and a `write`
        event in the writer's name with `range_unknown`."""
        seen: set[int] = set()
        for row in rows:
            alloc = self.ns.node_or_none(row["node"])
            if not isinstance(alloc, Allocation) or alloc.buffer is None or alloc.id in seen:
                continue
            seen.add(alloc.id)
            now = time.time_ns()
            self.journal.keep(alloc, "modified_ns", "changed_ns")
            alloc.modified_ns = alloc.changed_ns = now
            self.registry.nodes.update(alloc.id, modified_ns=now, changed_ns=now)
            writer = Credentials(pid=row["pid"], uid=row["uid"], gid=-1)
            # Numbers and flags only: a `write` detail is what a client reports too, and
            # carries no text (daemon/events.py, CLIENT_REPORTED).
            self.journal.event("write", alloc, writer, range_unknown=True)

    def _adopt_listed(self, kept: dict[int, list[int]], summary: dict) -> None:
        """Each listed allocation: a transient one is dropped (it never outlives the
        daemon), a durable one takes back what the keeper kept, or is `lost`. What it takes
        leaves `kept`."""
        for alloc in self.ns.allocations():
            if not alloc.durable:
                self.ns.forget(alloc)
                self.journal.event("drop", alloc, None, reason="transient after restart")
                summary["transients_dropped"] += 1
            elif alloc.capacity is None:
                continue  # durable but pending: there is no memory to adopt
            elif alloc.id in kept or -alloc.id in kept:
                adopted = self._adopt(alloc, kept.pop(alloc.id, None),
                                      kept.pop(-alloc.id, None))
                summary["adopted" if adopted else "lost"] += 1
            elif alloc.state != "lost":
                self._mark_lost(alloc, "the keeper holds no memory for it")
                summary["lost"] += 1

    def require_fds(self, uid: int | None, ecc: str) -> None:
        """NoMemory unless the descriptors a new allocation of `uid` will hold fit gpumemd's
        budget (daemon/fdbudget.py); uid None: only the total (root's doing, a restore)."""
        if self.fds is not None:
            self.fds.require(uid, fds_for(ecc))

    def allocate(self, dev, size: int, capacity: int, ecc: str, label: str):
        """Memory for a new allocation of `size`, once the device has room for its capacity
        and its parity (NoMemory/ENOSPC otherwise), and gpumemd descriptors for both."""
        self.require_fds(None, ecc)
        self.backend.check_free(dev, capacity + self.parity.extra(ecc, dev, capacity),
                                requested=size)
        return self.backend.allocate(capacity, dev.uuid, label=label)

    def deposit(self, alloc: Allocation) -> None:
        """Hand the keeper the allocation's fds: [data] or [data, parity]; a rollback of
        the transaction around it takes them back."""
        self.send(self.handover(alloc))
        self.journal.on_rollback(lambda: self.withdraw_quietly(alloc.id))

    def handover(self, alloc: Allocation) -> Deposit:
        """What depositing `alloc` sends, its fds taken now (on the event loop): send() may
        then run on a worker thread while the loop goes on."""
        fds = self.backend.keeper_fds(alloc.buffer)
        if alloc.parity is not None:
            fds += self.backend.keeper_fds(alloc.parity)
        return Deposit(alloc.id, f"make '{alloc.path or alloc.name}' durable", fds,
                       {"capacity": alloc.capacity, "device": alloc.device,
                        "registry": self.registry.identity.instance}, (alloc.buffer, alloc.parity))

    def prepare(self, ids: list[int], cred, mode: int, size: int, dev, capacity: int,
                ecc: str, label: str) -> Prepared:
        """Memory and parity for a durable allocation to be created under ids[-1] once the
        keeper holds it (Creation.prepare); ids[:-1] for its parents. Named
        by `label`, the path asked for, while it is outside the tree (handover's errors)."""
        *dir_ids, node_id = ids
        alloc = Allocation(id=node_id, name=label, parent=None, uid=cred.uid, gid=cred.gid,
                           mode=mode, created_ns=0, modified_ns=0, changed_ns=0, size=size,
                           capacity=capacity, device=dev.uuid, durable=True, state="ready",
                           ecc=ecc, buffer=self.allocate(dev, size, capacity, ecc, label))
        prepared = Prepared(alloc, dir_ids)
        try:
            self.parity.ensure(alloc, fresh=True)
        except BaseException:
            self.abandon(prepared)
            raise
        return prepared

    def abandon(self, prepared: Prepared) -> None:
        """A prepared allocation that will not be created: its memory goes, and its deposit
        if the keeper took it."""
        self.withdraw_quietly(prepared.alloc.id)
        self.free(prepared.alloc)

    def send_begin(self, deposit: Deposit) -> Callable[[], None] | None:
        """send() with the answer awaited on the event loop only briefly (the keeper's
        call_begin): None when done, else what waits for the rest, for a worker thread."""
        try:
            rest = self.keeper.deposit_begin(deposit.key, deposit.fds, deposit.meta)
        except (KeeperGone, FdStoreFull) as exc:
            raise self._refused(deposit, exc) from None
        finally:
            for fd in deposit.fds:      # sent (or failed): the keeper has its own copies
                os.close(fd)
        if rest is None:
            return None

        def wait() -> None:
            try:
                rest()
            except KeeperGone as exc:
                raise self._refused(deposit, exc) from None
        return wait

    @staticmethod
    def _refused(deposit: Deposit, exc: KeeperGone | FdStoreFull) -> Exception:
        if isinstance(exc, KeeperStalled):   # busy, not broken: it works once it answers
            return Busy(f"cannot {deposit.what} now: {exc}")
        if isinstance(exc, FdStoreFull):     # a limit, as a quota is: exit 7 (ENOSPC)
            return NoMemory(f"cannot {deposit.what}: {exc}", details={"errno": "ENOSPC"})
        return InternalError(f"cannot {deposit.what}: {exc}")

    def send(self, deposit: Deposit) -> None:
        """Give the keeper a deposit, closing its fds. Touches nothing but the keeper link,
        so it is safe on a worker thread. A stalled keeper is Busy (it works again once it
        answers), a gone one an internal error."""
        try:
            self.keeper.deposit(deposit.key, deposit.fds, deposit.meta)
        except (KeeperGone, FdStoreFull) as exc:
            raise self._refused(deposit, exc) from None
        finally:
            for fd in deposit.fds:
                os.close(fd)

    def withdraw_quietly(self, key: int) -> None:
        """Take a deposit back that a rolled-back transaction made; a keeper that cannot be
        reached is reconciled later (reconcile_keeper, redeposit_all, or the next start)."""
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)

    def free(self, alloc: Allocation) -> None:
        with alloc.parity_lock:           # a worker may be encoding it (ParityJob)
            if alloc.buffer is not None:
                self.backend.free(alloc.buffer)
                alloc.buffer = None
            self.parity.free(alloc)

    def stage(self, key: int, buf, capacity: int, device: str) -> None:
        """Deposit a resize's new memory under the staging key -id (reallocate)."""
        self.send(Deposit(key, "keep the resized memory", self.backend.keeper_fds(buf),
                          {"capacity": capacity, "device": device,
                           "registry": self.registry.identity.instance}))

    def require_could_fit(self, dev, size: int, ecc: str) -> None:
        """NoMemory with errno EFBIG for a size no device could ever hold: its footprint
        exceeds every device's total. A size that fits a device's total but not what is
        free now is check_free's (ENOSPC). `dev`: the device the request names; the
        message is the out-of-memory one (Backend.no_memory) and says why it is final."""
        if any(self._footprint(d, size, ecc) <= d.total for d in self.backend.devices()):
            return
        base = self.backend.no_memory(dev, self._footprint(dev, size, ecc), dev.free,
                                      requested=size)
        raise NoMemory(f"{base.message}; that exceeds the device's total memory: no device "
                       "here could ever hold it", details={**base.details, "errno": "EFBIG"})

    def _footprint(self, dev, size: int, ecc: str) -> int:
        """Bytes an allocation of `size` takes on `dev`: its capacity and its ECC parity."""
        capacity = round_up(max(size, 1), dev.granularity)
        return capacity + self.parity.extra(ecc, dev, capacity)

    def allocate_pending(self, alloc: Allocation, dev, size: int,
                          capacity: int, commit: Callable[[], None]) -> None:
        """Same order as create: allocate, deposit (durable), commit. A crash before the
        commit leaves the row pending and the keeper's copy an orphan the next start frees."""
        self.require_fds(alloc.uid, alloc.ecc)
        self.backend.check_free(dev, capacity + self.parity.extra(alloc.ecc, dev, capacity),
                                requested=size)
        alloc.buffer = self.backend.allocate(capacity, dev.uuid, label=alloc.path)
        alloc.device, alloc.state = dev.uuid, "ready"
        try:
            self.backend.zero(alloc.buffer, 0, size)
            if alloc.durable and not alloc.unlinked:
                self.deposit(alloc)
            commit()
        except BaseException:
            if alloc.durable:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(alloc.id)
            self.free(alloc)
            alloc.device, alloc.state = None, "pending"
            raise

    def reallocate(self, alloc: Allocation, dev, size: int,
                   capacity: int, commit: Callable[[], None]) -> None:
        """New memory for a new capacity, min(old, new size) bytes kept. Durable, the keeper
        never holds nothing for a committed allocation: (1) stage the new fds under -id,
        (2) commit, (3) deposit them under id (replacing the old copy), (4) withdraw -id. A
        crash before (2) restarts with the old capacity (the staged copy is freed); after
        it, start-up adopts whichever copy has the committed capacity (_adopt)."""
        with alloc.parity_lock:           # a worker may be encoding it (ParityJob)
            self._reallocate(alloc, dev, size, capacity, commit)

    def _reallocate(self, alloc: Allocation, dev, size: int,
                    capacity: int, commit: Callable[[], None]) -> None:
        if self._resize_in_place(alloc, dev, size, capacity, commit):
            return
        self.backend.check_free(dev, capacity, requested=size)
        new = self.backend.allocate(capacity, dev.uuid, label=alloc.path)
        old, old_size = alloc.buffer, alloc.size
        kept = alloc.durable and not alloc.unlinked
        try:
            kept_bytes = min(old_size, size)
            self.backend.copy(old, new, kept_bytes)
            if size > kept_bytes:
                self.backend.zero(new, kept_bytes, size)
            if kept:
                self.stage(-alloc.id, new, capacity, dev.uuid)
            alloc.buffer = new
            commit()
        except BaseException:
            alloc.buffer = old
            if kept:
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(-alloc.id)
            self.backend.free(new)
            raise
        if kept:
            try:
                self.deposit(alloc)
                self.keeper.withdraw(-alloc.id)
            except (KeeperGone, InternalError) as exc:   # redeposit_all() repairs this
                log.warning("keeper update after resizing '%s' failed: %s", alloc.path, exc)
        self.backend.free(old)

    def _resize_in_place(self, alloc: Allocation, dev, size: int,
                         capacity: int, commit: Callable[[], None]) -> bool:
        """Where the backend can (host memfds), change the capacity without a copy. The
        keeper holds the same memory, so only the order against the registry matters: grow
        before the commit, shrink after it; a crash between leaves the memory larger than
        the committed capacity, which adoption trims (HostBackend.adopt)."""
        if not self.backend.resizes_in_place:
            return False
        old_capacity, old_size = alloc.capacity or 0, alloc.size
        if capacity > old_capacity:
            self.backend.check_free(dev, capacity - old_capacity, requested=size)
            self.backend.resize_in_place(alloc.buffer, capacity)
            if size > old_size:            # past old_capacity the memory is new, so zero
                self.backend.zero(alloc.buffer, old_size, min(size, old_capacity))
            try:
                commit()
            except BaseException:
                self.backend.resize_in_place(alloc.buffer, old_capacity)
                raise
        else:
            commit()
            self.backend.resize_in_place(alloc.buffer, capacity)
        return True

    def take_strays(self, kept: dict[int, list[int]], metas: dict[int, dict] | None,
                     orphans: str) -> dict[int, list[int]]:
        """Take out of `kept` the entries that the `orphans` policy handles (start()).
        Refusing, close every fetched fd (the keeper keeps its own) and raise."""
        if orphans not in POLICIES:
            raise ValueError(f"unknown orphans policy {orphans!r}")
        listed = {a.id for a in self.ns.allocations()}
        foreign, why = classify(kept, metas, listed, self.registry.identity.instance,
                                self.registry.created, self.registry.identity.last_node_id())
        if foreign and orphans == "refuse":
            count, nbytes = held(kept, metas, foreign)
            for fds in kept.values():
                for fd in fds:
                    os.close(fd)
            raise OrphansHeld(count, nbytes, self.registry.path, why)
        if orphans != "refuse":
            foreign |= {k for k in kept if abs(k) not in listed}
        if foreign:
            log.warning("the keeper holds %d entr%s that registry %s does not list (%s); "
                        "%s them as told", len(foreign), "y" if len(foreign) == 1 else "ies",
                        self.registry.path, why or "unlisted",
                        "re-registering" if orphans == "adopt" else "freeing")
        return {k: kept.pop(k) for k in foreign}

    def adopt_identity(self, metas: dict[int, dict] | None) -> None:
        """Deposits made before the registry's identity went into their meta get it now, so
        that the next start can tell them from another registry's (daemon/orphans.py)."""
        if metas is None:
            return
        for alloc in self.ns.allocations():
            meta = metas.get(alloc.id)
            if meta is not None and "registry" not in meta and alloc.buffer is not None \
                    and alloc.durable:
                with contextlib.suppress(InternalError):
                    self.deposit(alloc)

    def _adopt(self, alloc: Allocation, fds: list[int] | None,
               staged: list[int] | None = None) -> bool:
        """Re-adopt kept memory. `staged` is what a resize deposited under -id before its
        commit (see resize()): of the two copies, the one with the registry's capacity is
        the committed one; it ends up under the id, and the other is freed."""
        copies = [(k, f) for k, f in ((alloc.id, fds), (-alloc.id, staged)) if f is not None]
        error: Exception | None = None
        for i, (key, kept_fds) in enumerate(copies):
            data_fds, parity_fds = kept_fds[:1], kept_fds[1:]
            try:
                alloc.buffer = self.backend.adopt(data_fds, alloc.capacity or 0,
                                                  alloc.device or "")
            except Exception as exc:  # noqa: BLE001 - this copy is not the committed one
                error = exc
                for fd in parity_fds:
                    os.close(fd)
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(key)
                continue
            self._adopt_parity(alloc, parity_fds)
            for other_key, other_fds in copies[i + 1:]:
                self.free_orphan(other_key, other_fds)
            if key != alloc.id:     # the resize committed: its copy becomes the kept one
                self.deposit(alloc)
                with contextlib.suppress(KeeperGone):
                    self.keeper.withdraw(key)
            if alloc.state in ("lost", "pending"):
                alloc.state = "ready"
                self.registry.nodes.update(alloc.id, state="ready")
            self.journal.event("adopt", alloc, None, capacity=alloc.capacity)
            return True
        self._mark_lost(alloc, f"re-adoption failed: {error}")
        return False

    def _adopt_parity(self, alloc: Allocation, fds: list[int]) -> None:
        """Take back the parity the keeper kept; a missing or wrong-sized one is rebuilt
        from the data by _settle_parity."""
        if not fds:
            return
        if alloc.ecc != "rs":
            for fd in fds:
                os.close(fd)
            return
        try:
            alloc.parity = self.backend.adopt(fds, self.parity.size_for(alloc),
                                              alloc.device or "")
            alloc.parity.blocks = (alloc.capacity or 0) // BLOCK
        except Exception as exc:  # noqa: BLE001 - rebuilt from the data instead
            log.warning("kept parity of '%s' unusable (%s); rebuilding it", alloc.path, exc)

    def _mark_lost(self, alloc: Allocation, reason: str) -> None:
        alloc.state = "lost"
        alloc.buffer = None
        self.registry.nodes.update(alloc.id, state="lost")
        self.journal.event("lost", alloc, None, reason=reason)
        log.warning("allocation '%s' (id %d) is lost: %s", alloc.path, alloc.id, reason)

    def free_orphan(self, key: int, fds: list[int], reason: str = "crash residue") -> None:
        """Free what the keeper held under a key the registry does not list. Normally the
        residue of a crash (docs/durability.md, "Crash ordering"), yet memory is going, so
        it is a warning."""
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(KeeperGone):
            self.keeper.withdraw(key)
        self.journal.event("orphan", None, None, key=key,
                    reason=f"the keeper held memory the registry does not list; {reason}")
        log.warning("freed the memory the keeper held under key %d, which the registry does "
                    "not list (%s)", key, reason)

    def adopt_orphans(self, strays: dict[int, list[int]], metas: dict[int, dict] | None,
                       summary: dict) -> dict[int, list[int]]:
        """--adopt-orphans: re-register each stray entry as a durable allocation in a new
        /lost+found/<UTC time>, owned by the daemon's user (root) with mode 0700, so that
        only root sees them until it hands them on (chown, mv). Returns the entries
        re-registered; their old keys are withdrawn once this commits (start()). One that
        cannot be (its device is gone, its size unknown) is freed and counted so."""
        if not strays:
            return {}
        directory = self.ns.recovery_dir()
        summary["recovery_dir"] = directory.path
        recovered = {}
        for key in sorted(strays, key=lambda k: (abs(k), k < 0)):
            if self._adopt_orphan(directory, key, strays[key], (metas or {}).get(key)):
                recovered[key] = strays[key]
                summary["orphans_adopted"] += 1
            else:
                summary["orphans_freed"] += 1
        return recovered

    def _adopt_orphan(self, directory: Directory, key: int, fds: list[int],
                      meta: dict | None) -> bool:
        """One entry: its size is the capacity its deposit recorded (the size asked for is
        not kept), its ECC `rs` when a parity fd came with it. The kept parity is dropped
        and rebuilt from the data (_settle_parity): what it last covered is not known."""
        capacity = capacity_of(fds, meta)
        try:
            dev = self.backend.device((meta or {}).get("device"))
            if capacity <= 0:
                raise InvalidState("its size is not known")
        except Exception as exc:  # noqa: BLE001 - freed instead, and said so
            self.free_orphan(key, fds, f"cannot be re-registered: {exc}")
            return False
        for fd in fds[1:]:
            os.close(fd)
        try:
            buf = self.backend.adopt(fds[:1], capacity, dev.uuid)
        except Exception as exc:  # noqa: BLE001 - the backend closed the fd
            self.free_orphan(key, [], f"cannot be re-registered: {exc}")
            return False
        alloc = self.ns.insert_node(
            Allocation, directory, entry_name(key), DAEMON, 0o600, size=capacity,
            capacity=capacity, device=dev.uuid, durable=True, state="ready",
            ecc="rs" if len(fds) > 1 else "none", buffer=buf)
        self.deposit(alloc)
        self.journal.event("adopt", alloc, None, capacity=capacity, key=key, recovered=True)
        log.warning("re-registered the memory the keeper held under key %d as '%s'", key,
                    alloc.path)
        return True

    def reconcile_keeper(self) -> tuple[int, int]:
        """After the keeper stalled and answers again: the requests it never answered may or
        may not have been applied, and withdrawals refused meanwhile were skipped. Make it
        hold exactly the durable allocations: withdraw every other key, then hand it every
        durable allocation again. Returns (withdrawn, redeposited)."""
        durable = {a.id for a in self.ns.allocations() if a.kept}
        extra = [key for key in self.keeper.keys() if key not in durable]
        for key in extra:
            self.keeper.withdraw(key)
        return len(extra), self.redeposit_all(action="resumed")

    def redeposit_all(self, action: str = "restarted") -> int:
        """After a keeper restart (or stall): hand it every durable allocation's fds again."""
        count = 0
        for alloc in self.ns.allocations():
            if alloc.kept:
                self.deposit(alloc)
                count += 1
        with self.journal.change(durable=False):
            self.journal.event("keeper", None, None, action=action, redeposited=count)
        return count

    @staticmethod
    def require_memory(alloc: Allocation) -> None:
        if alloc.state == "restoring":
            raise InvalidState(f"'{alloc.path}' is being restored from a snapshot; it is "
                               "served once the restore has checked every block",
                               details={"errno": "EAGAIN"})
        if alloc.state == "lost" and alloc.restore_queued:
            raise InvalidState(f"'{alloc.path}' is lost and queued for restore from a "
                               "snapshot (restore_on_start): it is served once restored",
                               details={"errno": "EAGAIN"})
        if alloc.state == "lost":
            raise InvalidState(f"'{alloc.path}' is lost: its memory is gone (a reboot or GPU "
                               "reset); `gpumemctl recover` tells more")
        if alloc.buffer is None:
            raise InvalidState(f"'{alloc.path}' has no memory yet (state {alloc.state})")
