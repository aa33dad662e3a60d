"""daemon/core/earlyparity.py: which blocks a refill's reports have encoded (issue 29)."""
from __future__ import annotations

import pytest

from daemon.core.earlyparity import MAX_RUNS, EarlyParity
from gpumemctl.protocol import UsageError

B = 128 * 1024


def take(e: EarlyParity, *ranges) -> list[tuple[int, int]]:
    runs = e.report(e.check([list(r) for r in ranges]))
    for first, stop in runs:
        e.mark(first, stop)
    return runs


def test_a_block_is_encoded_once_all_its_bytes_are_reported():
    e = EarlyParity(5 * B + 100)
    assert take(e, (0, B + 10)) == [(0, 1)]
    assert take(e, (B + 10, 2 * B + 5)) == [(1, 2)]         # split over two reports
    assert take(e, (4 * B, 5 * B + 100)) == [(4, 6)]        # the last, short block is whole
    assert e.encoded_bytes() == [[0, 2 * B], [4 * B, 5 * B + 100]]
    assert take(e, (3 * B + 1, 3 * B + 2)) == []            # block 3 not wholly reported


def test_a_block_reported_again_is_encoded_again():
    e = EarlyParity(4 * B)
    take(e, (0, 4 * B))
    assert take(e, (B + 5, B + 9)) == [(1, 2)]
    assert take(e, (B - 1, 3 * B + 1)) == [(0, 4)]


def test_ranges_of_one_report_in_any_order():
    e = EarlyParity(10 * B)
    assert take(e, (5 * B + 1, 8 * B), (B, 3 * B), (3 * B, 5 * B + 1)) == [(1, 8)]
    assert e.reported == [[B, 8 * B]]


def test_bad_ranges_and_too_many_runs_are_refused_and_change_nothing():
    e = EarlyParity(B)
    for bad in ([[0, B + 1]], [[3, 3]], [[-1, 2]], [[0]], [[0, True]], [(0, 1)], "x"):
        with pytest.raises(UsageError):
            e.check(bad)
    e = EarlyParity(4 * MAX_RUNS + 8)
    for k in range(MAX_RUNS // 64):                 # MAX_RUNS separate bytes: still taken
        take(e, *[(4 * i, 4 * i + 1) for i in range(64 * k, 64 * (k + 1))])
    assert len(e.reported) == MAX_RUNS
    before = [list(r) for r in e.reported]
    with pytest.raises(UsageError):
        take(e, (4 * MAX_RUNS + 2, 4 * MAX_RUNS + 3))
    assert e.reported == before
