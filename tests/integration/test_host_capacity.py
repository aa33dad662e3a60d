"""Host memory offered by several gpumemd instances (issue 27, item 11): each host-backend
daemon offered half of RAM, so a root daemon and a user's promised all of it between them,
without a word. Now a daemon says at start which other gpumemd processes run here, and its
default offer is at most the memory available when it starts."""
from __future__ import annotations

from daemon.backends.hostmem import available_memory, physical_memory


def test_a_second_daemon_says_the_first_offers_memory_too(daemon_factory):
    first = daemon_factory(extra_args=[])             # the default capacity
    second = daemon_factory(extra_args=[])
    pid = first.proc.pid
    line = next((ln for ln in second.log().splitlines()
                 if "other gpumemd instances run on this machine" in ln), None)
    assert line is not None and f"pid {pid} " in line, second.log()[-2000:]
    assert " WARNING: " in line and "host_capacity" in line


def test_the_default_offer_is_at_most_what_is_available(daemon_factory):
    before = available_memory()
    d = daemon_factory(extra_args=[])
    total = d.cli_json("status")["devices"][0]["total"]
    assert total <= physical_memory() // 2
    assert before is None or total <= before
