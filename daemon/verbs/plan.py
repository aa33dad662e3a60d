"""Plans, and the one runner that executes them (issue 25).

A verb whose work has a slow step is written as one generator, a *plan*: its first step runs
on the caller's thread (checks, fds, a ParityJob), then it yields each piece of slow work as
a request below and receives that work's result, or its exception thrown in at the yield; its
last step runs on the caller's thread again and checks what may have changed meanwhile. What
it returns is the verb's answer. Between the steps the holder stays: the memory stays, and no
other writer comes (docs/architecture.md, "How a plan runs").

One runner, two ways, with the same semantics:
- `await run(plan)`, under trio (the socket server, the mount): keeper work and large parity
  work go to worker threads, so that nothing slow holds the event loop (issue 13) while it
  serves everyone else. If the task is cancelled meanwhile, the Cancelled is thrown into the
  plan, whose cleanup (abandon a prepared create, withdraw a deposit, release a holder) runs
  before it goes on up.
- `run_sync(plan)`: every request on the calling thread, at once, so that nothing else runs
  between the steps (the mount's session ended after the loop has stopped, a session whose
  handshake failed, tests).

A verb without a slow step is a plain method; nothing else splits a verb in steps by hand.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import trio

if TYPE_CHECKING:
    from ..core.integrity import ParityJob

log = logging.getLogger("gpumemd")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class KeeperWork:
    """The rest of a keeper call the plan began (Custody.send_begin): the keeper answers in
    well under a millisecond, and then `rest` is None; a stalled one is waited for off the
    loop, for up to keeper.link.CALL_TIMEOUT. A refusal is thrown into the plan."""
    rest: Callable[[], object] | None


@dataclasses.dataclass(frozen=True)
class ParityWork:
    """A ParityJob (daemon/core/integrity.py), or None: nothing to do. The plan's last step runs
    Integrity.finish, which runs a job no worker ran (a small one, or one that failed)."""
    job: ParityJob | None


@dataclasses.dataclass(frozen=True)
class Offload:
    """Slow work of the plan's own on what the plan holds (a sleep's or a wake's copy of an
    allocation's bytes, daemon/core/sleep.py): on a worker thread under trio, here and now
    under run_sync. Its result is sent into the plan, its exception thrown in."""
    work: Callable[[], object]


@dataclasses.dataclass(frozen=True)
class Breathe:
    """A piece of long work is done (a verify's): let the loop run. `reached` is where it is
    (a block), for a progress callback."""
    reached: object = None


def breathing(steps: Generator[object, None, T]) -> Plan[T]:
    """A core unit's steps (a generator yielding where it is after each piece, returning
    its result) as a plan that yields Breathe between the pieces: a verify's blocks, a
    compaction's slices."""
    try:
        while True:
            try:
                reached = next(steps)
            except StopIteration as done:
                return done.value
            yield Breathe(reached)
    finally:
        steps.close()


@dataclasses.dataclass(frozen=True)
class Exclusive:
    """Hold the lock `name` from here to the plan's end (yielded before its first step)."""
    name: str


# Held from a durable create's (or `durable`'s) deposit to its commit: at most one key is in
# the keeper ahead of its row, which is what start-up takes for crash residue
# (daemon/core/orphans.py).
DEPOSITS = "deposits"

Request = KeeperWork | ParityWork | Offload | Breathe | Exclusive
Plan = Generator[Request, object, T]
OnBreathe = Callable[[Any], Awaitable[None]]     # given each Breathe's `reached`

# Per trio run (tests run several): the worker limits and the locks.
_KEEPER = trio.lowlevel.RunVar[trio.CapacityLimiter]("keeper_limiter")
_PARITY = trio.lowlevel.RunVar[trio.CapacityLimiter]("parity_limiter")
_OFFLOAD = trio.lowlevel.RunVar[trio.CapacityLimiter]("offload_limiter")
_LOCKS = trio.lowlevel.RunVar[dict[str, trio.Lock]]("plan_locks")
PARITY_THREADS = 2      # encodes in flight at once; more would only share the same cores
OFFLOAD_THREADS = 2     # sleeps and wakes copying at once: each takes a link's bandwidth
# Parity work this small runs on the loop: about 20 ms with the host's numpy codec, far
# less on a GPU; a thread would cost more than it saves, and the mount's close(2), which
# the kernel does not wait for, would see its effects later than it does now.
INLINE_BYTES = 4 << 20


def _advance(plan: Plan[T], sent: object, thrown: BaseException | None) -> Request:
    """The plan's next request; StopIteration carries its answer."""
    return plan.send(sent) if thrown is None else plan.throw(thrown)


# ---- under trio ---------------------------------------------------------------------------
_NOTHING = contextlib.nullcontext()     # `within` by default: steps need no context


async def run(plan: Plan[T], *, on_breathe: OnBreathe | None = None,
              within: contextlib.AbstractContextManager = _NOTHING) -> T:
    """Execute `plan` on the event loop. `on_breathe(reached)` is awaited at each Breathe
    (it must checkpoint; default: trio.sleep(0)); `within` (a reusable context manager) is
    entered around each of the plan's steps on the loop (the mount marks them as its own
    requests with it)."""
    held: list[tuple[str, trio.Lock]] = []       # Exclusive: released when the plan ends
    sent: object = None
    thrown: BaseException | None = None
    try:
        while True:
            try:
                with within:
                    request = _advance(plan, sent, thrown)
            except StopIteration as done:
                return done.value
            sent, thrown = None, None
            try:
                sent = await _perform(request, held, on_breathe)
            except BaseException as exc:  # noqa: BLE001 - thrown in: the plan cleans up
                thrown = exc
    finally:
        for _, lock in held:
            lock.release()


async def _perform(request: Request, held: list[tuple[str, trio.Lock]],
                   on_breathe: OnBreathe | None) -> object:
    if isinstance(request, KeeperWork):
        return await _keeper_work(request.rest)
    if isinstance(request, Offload):
        limiter = _get(_OFFLOAD, lambda: trio.CapacityLimiter(OFFLOAD_THREADS))
        return await trio.to_thread.run_sync(request.work, limiter=limiter)
    if isinstance(request, ParityWork):
        await _parity_work(request.job)
    elif isinstance(request, Breathe):
        await (trio.sleep(0) if on_breathe is None else on_breathe(request.reached))
    elif isinstance(request, Exclusive):
        if all(name != request.name for name, _ in held):
            lock = _lock(request.name)
            await lock.acquire()
            held.append((request.name, lock))
    else:
        raise TypeError(f"a plan yielded {request!r}, which is no request")
    return None


def _get(var, make):
    try:
        return var.get()
    except LookupError:
        value = make()
        var.set(value)
        return value


def _lock(name: str) -> trio.Lock:
    locks = _get(_LOCKS, dict)
    return locks.setdefault(name, trio.Lock())


async def _keeper_work(rest: Callable[[], object] | None) -> object:
    if rest is None:
        return None
    limiter = _get(_KEEPER, lambda: trio.CapacityLimiter(1))
    return await trio.to_thread.run_sync(rest, limiter=limiter)


async def _parity_work(job: ParityJob | None) -> None:
    """On a worker thread, unless small. A job that fails there is logged and left undone:
    the plan's last step runs it again on the loop, where the error reaches the client
    (Integrity.finish)."""
    if job is None or job.end - job.start <= INLINE_BYTES:
        return                  # nothing, or a few milliseconds: the last step runs it
    limiter = _get(_PARITY, lambda: trio.CapacityLimiter(PARITY_THREADS))
    try:
        await trio.to_thread.run_sync(job.run, limiter=limiter)
    except Exception:
        log.exception("parity work for '%s' failed on a worker thread", job.alloc.path)


# ---- on the calling thread ------------------------------------------------------------------
def run_sync(plan: Plan[T]) -> T:
    """Execute `plan` here and now: keeper work waited for on this thread, parity work left
    to the plan's last step (as a small job is under trio), no lock needed (nothing else runs
    between the steps), nothing to breathe for."""
    sent: object = None
    thrown: BaseException | None = None
    while True:
        try:
            request = _advance(plan, sent, thrown)
        except StopIteration as done:
            return done.value
        sent, thrown = None, None
        try:
            if isinstance(request, KeeperWork) and request.rest is not None:
                sent = request.rest()
            elif isinstance(request, Offload):
                sent = request.work()
        except BaseException as exc:  # noqa: BLE001 - thrown in: the plan cleans up
            thrown = exc
