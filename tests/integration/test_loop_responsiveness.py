"""Nothing slow on the event loop (issue 13): while one client closes a 1 GiB allocation it
wrote, which re-encodes all its parity, another client's requests are answered as fast as
ever. The encode runs on a worker thread (daemon/verbs/plan.py) while the handle is still held.
bench/loop.py measures the same with a table; this holds the target in CI."""
from __future__ import annotations

import threading
import time

from tests.sizes import MiB

SIZE = 1 << 30
TARGET_MS = 50.0
INTERVAL = 0.005          # another client's info, every 5 ms


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def test_info_stays_fast_while_another_client_closes_1_gib(daemon_factory):
    d = daemon_factory(extra_args=["--host-capacity", str(SIZE + SIZE // 2)])
    with d.client() as writer, d.client() as reader:
        writer.create("probe", "1M")
        writer.create("big", SIZE)
        handle = writer.open("big", "rw")
        chunk = bytes(range(256)) * (16 * MiB // 256)
        for offset in range(0, SIZE, len(chunk)):
            handle.write(chunk, offset)

        stop = threading.Event()
        spans: list[tuple[float, float]] = []

        def ask() -> None:
            # On a fixed schedule, each latency counted from the time the call was due:
            # a client that only asks again once answered would hide a stalled loop (one
            # slow call among thousands of fast ones: coordinated omission).
            due = time.perf_counter()
            while not stop.is_set():
                time.sleep(max(0.0, due - time.perf_counter()))
                reader.info("probe")
                end = time.perf_counter()
                while due < end:              # the calls that fell due while it waited
                    spans.append((due, end))
                    due += INTERVAL
        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        handle.close()                    # the parity of the whole GiB is encoded now
        t1 = time.perf_counter()
        stop.set()
        asker.join()

        # The close really did the work: the data verifies clean against its new parity.
        report = writer.verify(["big"])
    during = [(end - start) * 1000 for start, end in spans if start < t1 and end > t0]
    assert len(during) >= 20, f"only {len(during)} info calls overlapped a {t1 - t0:.2f} s close"
    p99 = percentile(during, 99)
    assert p99 < TARGET_MS, (f"info p99 {p99:.1f} ms (max {max(during):.1f} ms) while "
                             f"another client's close ran {t1 - t0:.2f} s")
    big = report["allocations"][0]
    assert big["blocks"] == SIZE // (128 << 10) and big["clean"] == big["blocks"]
