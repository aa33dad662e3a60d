"""`gpumemctl check` runs SQLite's integrity check, which reads every page of the registry, on a
worker thread (daemon/server/verify.check): other clients are answered meanwhile, instead of
waiting for the whole check as they would if it ran on the event loop."""
from __future__ import annotations

import threading
import time

# A registry large enough that its integrity check takes a while, with few nodes (the checks
# that compare in-memory state run on the loop; they stay short): each mkdir and rm of a
# ~3.9 KB path logs two events holding that path.
DEEP = "/".join(["d" * 250] * 15)
LEAF = DEEP + "/" + "l" * 90
ROUNDS = 6000
INFOS_DURING_CHECK = 3      # at most one could slip in beside a check run on the loop


def grow_registry(client) -> None:
    client.mkdir(DEEP, parents=True)
    for _ in range(ROUNDS):
        client.mkdir(LEAF)
        client.remove(LEAF, recursive=True)


def test_info_is_answered_while_check_runs(daemon):
    with daemon.client() as builder:
        grow_registry(builder)
        builder.mkdir("probe")

    check_span: dict[str, float] = {}
    report: dict = {}
    started = threading.Event()

    def run_check() -> None:
        with daemon.client() as c:
            started.set()
            check_span["start"] = time.monotonic()
            report.update(c.check())
            check_span["end"] = time.monotonic()

    info_spans: list[tuple[float, float]] = []
    with daemon.client() as prober:
        checker = threading.Thread(target=run_check)
        checker.start()
        started.wait()
        while checker.is_alive():
            begun = time.monotonic()
            assert prober.info("probe")["path"] == "probe"
            info_spans.append((begun, time.monotonic()))
        checker.join()

    assert report["clean"], report["problems"]
    check_start, check_end = check_span["start"], check_span["end"]
    check_seconds = check_end - check_start
    inside = [(b, e) for b, e in info_spans if b >= check_start and e <= check_end]
    # Ordering, not speed: answers that began and ended while the check ran.
    assert len(inside) >= INFOS_DURING_CHECK, (len(inside), check_seconds)
