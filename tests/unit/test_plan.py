"""The plan runner (daemon/verbs/plan.py) on its own: the same answer under trio and on the
calling thread, slow work on worker threads, the deposit lock held from the first step to the
last, and a cancellation thrown into the plan so that its cleanup runs."""
from __future__ import annotations

import threading

import pytest
import trio

from daemon.verbs.plan import (
    DEPOSITS,
    INLINE_BYTES,
    Breathe,
    Exclusive,
    KeeperWork,
    ParityWork,
    run,
    run_sync,
)


class Job:
    """A stand-in ParityJob: records the thread it ran on."""

    def __init__(self, size: int, fail: bool = False):
        self.start, self.end, self.fail = 0, size, fail
        self.alloc = type("Alloc", (), {"path": "a"})()
        self.ran_on: str | None = None
        self.done = False

    def run(self) -> None:
        self.ran_on = threading.current_thread().name
        if self.fail:
            raise RuntimeError("the codec failed")
        self.done = True


def plan(steps: list, job: Job | None = None, rest=None):
    steps.append("first")
    got = yield KeeperWork(rest)
    steps.append(("keeper", got))
    yield ParityWork(job)
    steps.append(("parity", job.done if job else None))
    yield Breathe(7)
    steps.append("last")
    return "answer"


def test_run_and_run_sync_take_the_same_steps_to_the_same_answer():
    a, b = [], []
    assert trio.run(run, plan(a, rest=lambda: 42)) == run_sync(plan(b, rest=lambda: 42)) \
        == "answer"
    assert a == b == ["first", ("keeper", 42), ("parity", None), "last"]


def test_large_parity_work_runs_on_a_worker_thread_small_work_is_left_to_the_last_step():
    big, small = Job(INLINE_BYTES + 1), Job(INLINE_BYTES)
    steps: list = []
    trio.run(run, plan(steps, big))
    assert big.done and big.ran_on != threading.main_thread().name
    trio.run(run, plan([], small))
    assert small.ran_on is None                 # Integrity.finish runs it, in the last step


def test_a_parity_job_failing_on_its_thread_is_logged_and_left_undone(caplog):
    job = Job(INLINE_BYTES + 1, fail=True)
    steps: list = []
    assert trio.run(run, plan(steps, job)) == "answer"
    assert ("parity", False) in steps
    [record] = [r for r in caplog.records if "failed on a worker thread" in r.getMessage()]
    record.expected = True             # the one error this test makes (tests/conftest.py)


def test_a_keeper_refusal_is_thrown_into_the_plan():
    def refused():
        raise ConnectionError("keeper gone")

    def cleaning(seen: list):
        try:
            yield KeeperWork(refused)
        except ConnectionError:
            seen.append("cleaned up")
            raise
    for runner in (lambda p: trio.run(run, p), run_sync):
        seen: list = []
        with pytest.raises(ConnectionError):
            runner(cleaning(seen))
        assert seen == ["cleaned up"]


def test_a_cancelled_request_runs_the_plans_cleanup():
    seen: list = []

    def slow():
        try:
            yield ParityWork(Job(INLINE_BYTES + 1))
            yield Breathe()
        except trio.Cancelled:
            seen.append("abandoned")
            raise
        seen.append("committed")

    async def main():
        with trio.move_on_after(0):
            await run(slow())
    trio.run(main)
    assert seen == ["abandoned"]


def test_the_deposit_lock_is_held_from_the_first_step_to_the_last():
    order: list = []

    def durable(name: str):
        yield Exclusive(DEPOSITS)
        order.append(f"{name} prepared")
        yield Breathe()                          # the keeper's answer, say
        yield Breathe()
        order.append(f"{name} committed")

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, durable("a"))
            nursery.start_soon(run, durable("b"))
    trio.run(main)
    assert order in (["a prepared", "a committed", "b prepared", "b committed"],
                     ["b prepared", "b committed", "a prepared", "a committed"])


def test_breathe_awaits_the_progress_callback_with_what_the_piece_reached():
    reached: list = []

    async def progress(block) -> None:
        reached.append(block)
        await trio.sleep(0)
    assert trio.run(lambda: run(plan([]), on_breathe=progress)) == "answer"
    assert reached == [7]
