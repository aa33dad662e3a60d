"""Parity encoded while a refill is still being written (issue 29): which bytes of a refill
its client has reported final (op `refill_written`), and which ECC blocks have had their
parity encoded from them.

A `gpumemctl load` copies a file into a refill handle's memory and, as it goes, reports the
bytes it has written and will not write again; the daemon encodes the blocks those reports
cover whole, on a worker thread, while the copy goes on, so that the close encodes only
what was never reported (its `written`). The rule for what a report means, and what a
client that breaks it gets: docs/protocol.md, "Snapshots".

This is bookkeeping only: plain ranges, no memory, no codec (daemon/verbs/refill.py runs the
encodes). A report has the blocks it touches encoded from their bytes as they are then,
each once all of its bytes below the allocation's size have been reported, whichever
reports did it: a block split between two reports is encoded when the second one comes, and
a block reported again (written again) is encoded again.
"""
from __future__ import annotations

import bisect

from gpumemctl.protocol import UsageError

from ..ecc.layout import BLOCK

MAX_RUNS = 1024         # separate reported ranges kept per refill; a loader makes one
MAX_RANGES = 64         # ranges in one report


def _add(runs: list[list[int]], start: int, end: int) -> None:
    """Merge [start, end) into the sorted, disjoint `runs` (touching ones join)."""
    merged = [start, end]
    keep: list[list[int]] = []
    for run in runs:
        if run[1] < merged[0] or run[0] > merged[1]:
            keep.append(run)
        else:
            merged = [min(merged[0], run[0]), max(merged[1], run[1])]
    keep.append(merged)
    keep.sort()
    runs[:] = keep


def _holding(runs: list[list[int]], start: int) -> list[int]:
    """The run of the sorted, disjoint `runs` that holds byte `start` (one does)."""
    return runs[bisect.bisect_right(runs, start, key=lambda run: run[0]) - 1]


class EarlyParity:
    """One refill's reports and the blocks encoded from them."""

    def __init__(self, size: int):
        self.size = size
        self.reported: list[list[int]] = []    # byte ranges reported final, merged
        self.encoded: list[list[int]] = []     # block ranges whose parity is encoded, merged

    def check(self, ranges: object) -> list[tuple[int, int]]:
        """A report's ranges as (start, end) pairs within the size; a usage error naming
        the first one that is not."""
        if not isinstance(ranges, list) or len(ranges) > MAX_RANGES:
            raise UsageError(f"invalid ranges: expected a list of at most {MAX_RANGES} "
                             "[start, end] byte ranges")
        out = []
        for r in ranges:
            if not (isinstance(r, list) and len(r) == 2 and
                    all(isinstance(v, int) and not isinstance(v, bool) for v in r) and
                    0 <= r[0] < r[1] <= self.size):
                raise UsageError(f"invalid written range {r!r}: expected [start, end] with "
                                 f"0 <= start < end <= {self.size}")
            out.append((r[0], r[1]))
        return out

    def report(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Take a report (checked ranges): the block ranges [first, stop) to encode now,
        for the caller to encode and then `mark`: every block a range of it touches whose
        bytes have all been reported (by it and earlier reports), encoded again if it was
        before (its bytes were written again and reported again). Past MAX_RUNS separate
        ranges the report is refused, nothing of it kept."""
        runs = [list(r) for r in self.reported]
        for a, b in ranges:
            _add(runs, a, b)
        if len(runs) > MAX_RUNS:
            raise UsageError(f"a refill's reports may leave at most {MAX_RUNS} separate "
                             "ranges: report the bytes in order, or fewer of them")
        self.reported = runs
        todo: list[list[int]] = []
        for a, b in ranges:
            whole_from, whole_to = _holding(runs, a)
            first = max(a // BLOCK, -(-whole_from // BLOCK))
            stop = min(-(-b // BLOCK), self._whole_blocks_below(whole_to))
            if stop > first:
                _add(todo, first, stop)
        return [(a, b) for a, b in todo]

    def _whole_blocks_below(self, end: int) -> int:
        """The blocks that lie wholly below byte `end`; the last one counts as whole at the
        size (its bytes past the size are not protected)."""
        return -(-end // BLOCK) if end >= self.size else end // BLOCK

    def mark(self, first: int, stop: int) -> None:
        """Blocks [first, stop) have their parity encoded from reported bytes."""
        _add(self.encoded, first, stop)

    def encoded_bytes(self) -> list[list[int]]:
        """The byte ranges whose parity is encoded (blocks, the last cut at the size)."""
        return [[a * BLOCK, min(b * BLOCK, self.size)] for a, b in self.encoded]
