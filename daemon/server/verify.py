"""The handlers of the integrity ops: verify, recover, scrub, check and debug_corrupt, and the
progress frames of verify and recover (docs/ecc.md, docs/protocol.md)."""
from __future__ import annotations

import trio

from gpumemctl.protocol import InternalError, PermissionDenied, UsageError, jsontext
from gpumemctl.protocol.errors import OK, REPAIRED, UNCORRECTABLE

from ..core.describe import shown_path
from ..core.nodes import Allocation
from ..ecc.layout import BLOCK
from ..verbs.plan import run
from .call import (
    Call,
    ProgressSend,
    Reply,
    administrator,
    privileged,
    require_administrator,
)

PROGRESS_SECONDS = 0.1      # at most one progress frame per this (plus the first)
# The per-allocation results a verify answer carries at most (fit_results); far below the
# 64 MiB of any answer (daemon/server/transport.py).
VERIFY_ANSWER_BYTES = 16 << 20


NOT_PERMITTED = "not permitted"   # a result's "repair" where the caller may not repair it


async def verify(call: Call) -> Reply:
    """Verify (with `repair`, repair) the named allocations or all: synchronous for the
    client, piece by piece for the daemon (the event loop runs between pieces).

    A repair writes the allocation (back to what its parity says), so `repair` repairs only
    what the caller may repair (may_repair); the others are verified as without it, and
    their result says `"repair": "not permitted"` (damage left in them: exit 8)."""
    a = call.args
    targets = call.verbs.checks.ecc_targets(a["paths"], call.session.cred, a["all"])
    repairs = [a["repair"] and may_repair(call, t) for t in targets]
    results = await verify_all(call, targets, repairs)
    for result, repaired in zip(results, repairs, strict=True):
        if a["repair"] and not repaired:
            result["repair"] = NOT_PERMITTED
    shown, left_out = fit_results(results)
    return {"allocations": shown, "summary": ecc_summary(results),
            "complete": not left_out, "left_out": left_out}, []


def fit_results(results: list[dict]) -> tuple[list[dict], int]:
    """The results one answer carries: all of them while their JSON fits in
    VERIFY_ANSWER_BYTES; past it those with damage first, then the clean ones, in the
    order verified, and how many were left out (the summary counts every one). One user's
    thousands of allocations with 4 KiB names must not make root's `verify --all` fail
    for an answer over 64 MiB (issue 24)."""
    sizes = [len(jsontext.dumps(r)) + 1 for r in results]
    if sum(sizes) <= VERIFY_ANSWER_BYTES:
        return results, 0
    damaged = [i for i, r in enumerate(results) if _has_damage(r)]
    clean = [i for i, r in enumerate(results) if not _has_damage(r)]
    kept, used = [], 0
    for i in damaged + clean:
        if used + sizes[i] <= VERIFY_ANSWER_BYTES:
            kept.append(i)
            used += sizes[i]
    return [results[i] for i in sorted(kept)], len(results) - len(kept)


def _has_damage(result: dict) -> bool:
    return bool(result.get("corrected") or result.get("uncorrectable") or
                result.get("damaged") or result.get("damaged_ranges"))


def may_repair(call: Call, alloc: Allocation) -> bool:
    """The owner, or the administrator (as for `recover`): verify needs only read
    permission, and a reader must not write someone else's allocation by repairing it."""
    return alloc.uid == call.session.cred.uid or administrator(call)


async def recover(call: Call) -> Reply:
    alloc = call.verbs.queries.lookup_allocation(call.args["path"], call.session.cred)
    if alloc.uid != call.session.cred.uid:
        require_administrator(call, f"recover '{alloc.path}', which uid {alloc.uid} owns")
    [result] = await verify_all(call, [alloc], [True])
    return {"allocation": result,
            "info": call.verbs.queries.info(call.args["path"], call.session.cred)}, []


async def verify_all(call: Call, targets: list[Allocation],
                     repairs: list[bool]) -> list[dict]:
    """Verify each target, repairing those whose entry in `repairs` is true, piece by
    piece (the loop runs between pieces: Checks.verify is a plan). Each result (and progress
    frame) names the target by a name the caller may search to."""
    checks = call.verbs.checks
    names = [shown_path(t, call.session.cred) for t in targets]
    meter = None
    if call.progress is not None:
        meter = EccProgress([checks.protected_bytes(t) for t in targets], names,
                            call.progress)
        await meter.report(force=True)
    results = []
    for i, target in enumerate(targets):
        if meter is None:
            result = await run(checks.verify(target, repairs[i]))
        else:
            meter.begin(i)
            result = await run(checks.verify(target, repairs[i]), on_breathe=meter.piece)
            meter.end()
        results.append({**result, "path": names[i]})
    return results


async def scrub(call: Call) -> Reply:
    """action: start (with an optional rate in bytes/s), stop, status."""
    scrubber = call.server.scrubber
    if scrubber is None:
        raise InternalError("this gpumemd has no scrubber")
    action = call.args["action"]
    if action in ("start", "stop"):
        require_administrator(call, f"{action} a scrub")
    if action == "start":
        return scrubber.start(call.args["rate"]), []
    if action == "stop":
        return scrubber.stop(), []
    return visible_scrub_status(call, scrubber.status()), []


def visible_scrub_status(call: Call, status: dict) -> dict:
    """`scrub status` as this caller may see it: the per-allocation lines only of the
    allocations it could `info` now (search permission on every directory above; the
    privileged see all), so that names inside private directories do not leak. The totals
    stay whole: they name nothing."""
    if privileged(call.session):
        return status

    def visible(lines: dict) -> dict:
        out = {}
        for key, line in lines.items():
            node = call.verbs.queries.node_or_none(int(key))
            if node is not None and call.verbs.queries.may_search_to(node, call.session.cred):
                out[key] = {**line, "path": shown_path(node, call.session.cred)}
        return out
    status = dict(status)
    if "allocations" in status:
        status["allocations"] = visible(status["allocations"])
    if status.get("last") and "allocations" in status["last"]:
        status["last"] = {**status["last"], "allocations": visible(status["last"]["allocations"])}
    return status


async def check(call: Call) -> Reply:
    repair = call.args["repair"]
    if repair and not privileged(call.session):
        raise PermissionDenied("permission denied: only root or the daemon's user may repair")
    # SQLite's integrity check reads the whole registry (most of a second when it is large):
    # on a worker thread, with a read-only connection of its own, while the loop serves
    # everyone else. The other checks compare in-memory state: on the loop, in one go, so
    # that no change lands between their reads.
    checks = call.verbs.checks
    integrity_errors = await trio.to_thread.run_sync(checks.registry_integrity_errors)
    return checks.check(repair, integrity_errors=integrity_errors), []


async def debug_corrupt(call: Call) -> Reply:
    a = call.args
    try:
        pattern = bytes.fromhex(a["pattern"])
    except ValueError:
        raise UsageError(f"invalid pattern {a['pattern']!r}: expected hex bytes, "
                         "e.g. ff or deadbeef") from None
    return call.verbs.checks.corrupt(a["path"], call.session.cred, a["offset"], a["length"],
                                     pattern, a["parity"]), []


class EccProgress:
    """The progress frames of one verify or recover: one at the start, then at most one
    per PROGRESS_SECONDS. `total_bytes` is the protected bytes (the size of each allocation
    with ECC and memory) of all targets at the start; `done_bytes` never decreases and
    never passes it, whatever the allocations do meanwhile (grow, shrink, go away)."""

    def __init__(self, sizes: list[int], names: list[str], send: ProgressSend):
        """`sizes`: the protected bytes of each target now (Checks.protected_bytes);
        `names`: what to call each in the frames."""
        self.names, self.send = names, send
        self.sizes = sizes
        self.total = sum(self.sizes)
        self.index = 0              # the allocation being verified
        self.base = 0               # protected bytes of the allocations finished
        self.current = 0            # bytes of the current one checked so far
        self.last = -float("inf")

    def begin(self, index: int) -> None:
        self.index, self.current = index, 0

    def end(self) -> None:
        self.base += self.sizes[self.index]
        self.index, self.current = self.index + 1, 0

    async def piece(self, block: int) -> None:
        self.current = min(block * BLOCK, self.sizes[self.index])
        await self.report()

    async def report(self, force: bool = False) -> None:
        now = trio.current_time()
        if not force and now - self.last < PROGRESS_SECONDS:
            await trio.sleep(0)
            return
        self.last = now
        i = min(self.index, len(self.names) - 1)
        await self.send({
            "path": self.names[i] if self.names else None,
            "done_bytes": self.base + self.current, "total_bytes": self.total,
            "allocations_done": self.index, "allocations": len(self.names)})


def ecc_summary(results: list[dict]) -> dict:
    """Totals over allocations, and the exit code they mean (docs/ecc.md): 0 clean, 1
    damage found and all of it repaired, 8 damage left (uncorrectable, or found without
    --repair)."""
    keys = ("blocks", "clean", "corrected", "uncorrectable", "skipped", "symbols", "bytes")
    total = {k: sum(r.get(k, 0) for r in results) for k in keys}
    total["unrepaired"] = sum(len(r.get("damaged", [])) for r in results)
    total["allocations"] = len(results)
    left = total["uncorrectable"] + total["unrepaired"] + \
        sum(len(r.get("damaged_ranges", [])) for r in results)
    total["exit"] = UNCORRECTABLE if left else (REPAIRED if total["corrected"] else OK)
    return total
