"""A repair must never undo a client's writes. A client that opened an allocation read-write
through the socket writes through its own fd, anywhere, and the parity catches up only at its
close; a verify --repair (or a scrub) meanwhile would take its fresh bytes for damage, and a
write of up to 4 KiB is within what RS(136,128) "corrects": the write would be silently
reverted. Such an allocation is skipped, not judged, until the writer closes."""
from __future__ import annotations

MiB = 1 << 20


def test_verify_repair_skips_an_allocation_a_client_is_writing(daemon):
    fresh = b"W" * 4096                          # 4 bytes in each of the block's codewords
    with daemon.client() as c:
        c.create("a", 4 * MiB)
        c.write("a", b"\0" * (4 * MiB))
        handle = c.open("a", "rw")
        handle.write(fresh, 8192)
        with daemon.client() as other:
            report = other.verify(["a"], repair=True)["summary"]
            assert report["corrected"] == 0 and report["skipped"] == 32, report
        handle.close()                           # the parity catches up here
        assert c.read("a", offset=8192, length=4096) == fresh
        after = c.verify(["a"])["summary"]
        assert (after["clean"], after["corrected"]) == (32, 0), after
