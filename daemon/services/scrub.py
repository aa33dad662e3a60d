"""The background scrubber: verify and repair every protected block, slowly.

A scrub walks the allocations in id order and each one block range at a time (the plan
of Checks.verify, with repair, run by daemon/verbs/plan.py's runner), so it shares the
event loop with everything else. It is rate-limited: with `rate` (bytes/s) it sleeps to
stay under that rate; without, it sleeps nine times as long as each piece took, so that it
uses at most 10% of the codec's (and the memory's) time and leaves at least 90% to users.

Its state is persisted in the registry (meta key `scrub`, JSON) after each allocation and
about once a second: a daemon that is killed mid-scrub resumes at the allocation and block
it had reached when it starts again. Counters: in total and per allocation, bytes and blocks
scrubbed, duration, corrected and uncorrectable blocks, skipped blocks (unsealed, or
written since their last sync). `gpumemctl scrub status` prints them (docs/ecc.md).
`lifetime` adds up every scrub that ended (finished or stopped) since the registry was made:
monotonic counters for `gpumemctl metrics` (docs/metrics.md).

`default_rate` (the configuration's `scrub_rate`) applies to a scrub started without a rate;
None (the default, or `scrub_rate = 0`) means the 10% duty cycle above.
"""
from __future__ import annotations

import json
import logging
import time

import trio

from gpumemctl.protocol import InvalidState, UsageError

from ..core.nodes import Allocation
from ..ecc.layout import BLOCK
from ..verbs import Verbs
from ..verbs.plan import run

log = logging.getLogger("gpumemd")

META_KEY = "scrub"
SAVE_SECONDS = 1.0
DUTY = 0.10                 # without a rate: the share of time a scrub may take
COUNTERS = ("bytes", "blocks", "clean", "corrected", "uncorrectable", "skipped", "symbols")


class _Stopped(Exception):
    """`scrub stop` came: thrown into the verify between two pieces."""


def _zero() -> dict:
    return {k: 0 for k in COUNTERS}


class Scrubber:
    def __init__(self, verbs: Verbs, default_rate: int | None = None):
        self.v = verbs
        self.default_rate = default_rate
        self.state = self._load()
        self.wake = trio.Event()
        self._stop = False
        self._saved = 0.0           # when the state was last saved (monotonic)
        self._piece_began = 0.0     # when the piece being verified began

    # ---- persisted state ----------------------------------------------------------------
    def _load(self) -> dict:
        raw = self.v.reports.meta(META_KEY)
        if raw:
            try:
                state = json.loads(raw)
            except ValueError:
                state = None
            if isinstance(state, dict):
                return state
            log.warning("scrub state in the registry is unreadable; starting afresh")
        return {"running": False, "last": None}

    def _save(self) -> None:
        self.v.reports.save_meta(META_KEY, json.dumps(self.state))

    # ---- control (socket requests) --------------------------------------------------------
    def start(self, rate: int | None) -> dict:
        if rate is not None and rate < 1:
            raise UsageError(f"invalid rate {rate}: bytes per second, at least 1")
        if self.state.get("running"):
            raise InvalidState("a scrub is already running; `gpumemctl scrub status` shows "
                               "it, `gpumemctl scrub stop` stops it")
        if rate is None:
            rate = self.default_rate
        total = sum(a.size or 0 for a in self._targets())
        before = self.state
        self.state = {"running": True, "rate": rate, "started_ns": time.time_ns(),
                      "position": {"id": 0, "block": 0}, "to_scrub": total,
                      "elapsed": 0.0, "totals": _zero(), "allocations": {},
                      "last": self.state.get("last"), "lifetime": self.lifetime()}
        try:
            self._save()
        except Exception:
            # Not started (a full state disk: exit 7): never left shown running with
            # nothing done, refusing every later start (issue 24).
            self.state = before
            raise
        self.wake.set()
        try:
            self._event("scrub", action="start", rate=rate, bytes=total)
        except Exception as exc:  # noqa: BLE001 - it runs: only its event is missing
            log.warning("the scrub started, but its start event was not logged: %s", exc)
        return self.status()

    def stop(self) -> dict:
        if not self.state.get("running"):
            raise InvalidState("no scrub is running")
        self._stop = True
        self.wake.set()
        return self.status()

    def status(self) -> dict:
        s = dict(self.state)
        if s.get("running"):
            done = s["totals"]["bytes"]
            wall = (time.time_ns() - s["started_ns"]) / 1e9
            rate = done / wall if wall > 0 else 0.0
            s["progress"] = min(1.0, done / s["to_scrub"]) if s["to_scrub"] else 1.0
            s["rate_now"] = rate
            s["eta_seconds"] = max(0.0, (s["to_scrub"] - done) / rate) if rate else None
        return s

    # ---- the task -----------------------------------------------------------------------
    async def run(self) -> None:
        """The daemon's scrub task: idle until a scrub starts (or resumes at start-up)."""
        if self.state.get("running"):
            log.info("resuming the scrub at allocation %(id)s block %(block)s",
                     self.state["position"])
        while True:
            if not self.state.get("running"):
                await self.wake.wait()
                self.wake = trio.Event()
                continue
            try:
                await self._scrub()
            except Exception as exc:
                log.exception("the scrub failed and stopped")
                self._fail(f"{type(exc).__name__}: {exc}")

    def _targets(self):
        return sorted((a for a in self.v.queries.allocations()
                       if a.ecc == "rs" and a.buffer is not None and not a.unlinked),
                      key=lambda a: a.id)

    async def _scrub(self) -> None:
        pos = self.state["position"]
        self._saved = time.monotonic()
        for alloc in self._targets():
            if alloc.id < pos["id"]:
                continue
            if self._stop:
                return self._finish(stopped=True)
            first = pos["block"] if alloc.id == pos["id"] else 0
            pos.update(id=alloc.id, block=first)
            try:
                self._count(alloc, await self._verify(alloc, first))
            except _Stopped:
                return self._finish(stopped=True)
            pos.update(id=alloc.id + 1, block=0)
            self._save()
            await trio.sleep(0)
        self._finish(stopped=False)

    async def _verify(self, alloc: Allocation, first: int) -> tuple[dict, float]:
        """One allocation, piece by piece from block `first`; its totals and seconds. Between
        pieces: the position noted, the throttle, the state saved about once a second, and a
        stop asked for meanwhile honoured (_Stopped) before the next piece."""
        t0 = self._piece_began = time.monotonic()

        async def between(block: int) -> None:
            took = time.monotonic() - self._piece_began
            self.state["position"]["block"] = block
            self.state["elapsed"] += took
            await self._throttle(took)
            if time.monotonic() - self._saved > SAVE_SECONDS:
                self._save()
                self._saved = time.monotonic()
            if self._stop:
                raise _Stopped
            self._piece_began = time.monotonic()
        result = await run(self.v.checks.verify(alloc, repair=True, first_block=first),
                           on_breathe=between)
        return result, time.monotonic() - t0

    async def _throttle(self, took: float) -> None:
        rate = self.state.get("rate")
        if rate:
            # Sleep until this piece's bytes fit under the rate.
            await trio.sleep(min(1.0, self.v.checks.chunk_blocks * BLOCK / rate))
        else:
            await trio.sleep(took * (1 - DUTY) / DUTY)

    def _count(self, alloc: Allocation, verified: tuple[dict, float]) -> None:
        result, seconds = verified
        per = {k: result.get(k, 0) for k in COUNTERS}
        per.update(path=alloc.path, seconds=round(seconds, 3),
                   rate=per["bytes"] / seconds if seconds else None,
                   finished_ns=time.time_ns())
        self.state["allocations"][str(alloc.id)] = per
        for k in COUNTERS:
            self.state["totals"][k] += per[k]

    def _fail(self, error: str) -> None:
        """A scrub that met an error (a full state disk, a bug) ends as stopped, with the
        error in `scrub status`. Its state and event are written if the registry lets
        them: a registry that cannot be written is why many scrubs fail."""
        try:
            self._finish(stopped=True, error=error)
        except Exception as exc:  # noqa: BLE001 - the in-memory state is already final
            log.error("the failed scrub's state could not be saved: %s", exc)

    def _finish(self, stopped: bool, error: str | None = None) -> None:
        s = self.state
        now = time.time_ns()
        wall = (now - s["started_ns"]) / 1e9
        last = {"started_ns": s["started_ns"], "finished_ns": now, "stopped": stopped,
                "seconds": wall, "busy_seconds": s["elapsed"], "totals": s["totals"],
                "rate": s["totals"]["bytes"] / wall if wall > 0 else None,
                "allocations": s["allocations"]}
        if error is not None:
            last["error"] = error
        lifetime = self.lifetime()
        lifetime["runs"] += 1
        for k in COUNTERS:
            lifetime[k] += s["totals"][k]
        self.state = {"running": False, "last": last, "lifetime": lifetime}
        self._stop = False
        self._save()
        t = s["totals"]
        self._event("scrub", action="stopped" if stopped else "finished",
                    **{k: t[k] for k in ("bytes", "corrected", "uncorrectable", "skipped")})

    def lifetime(self) -> dict:
        """Counters over every scrub that ended: runs, and COUNTERS summed."""
        kept = self.state.get("lifetime") or {}
        return {k: int(kept.get(k, 0)) for k in ("runs", *COUNTERS)}

    def _event(self, kind: str, **detail) -> None:
        self.v.reports.note(kind, **detail)
