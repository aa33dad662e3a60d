"""The events a file made on the mount leaves (issue 26; docs/mount.md, "What each call
costs"): a creat(2), write and close of a new transient file record one `create` and no
`resize` (the write's first memory is no event of its own, as a write within the capacity
is none), while its row has its size and memory as before (`check` clean); a truncate that
sizes a new file, and a write past a file's capacity, still record `resize`."""
from __future__ import annotations

import os

KiB = 1 << 10


def kinds(d, path: str) -> list[str]:
    """The kinds of the events about `path`, oldest first."""
    return [e["kind"] for e in d.cli_json("events", "--limit", "1000") if e["path"] == path]


def test_a_file_written_on_the_mount_records_one_create(mounted):
    d = mounted
    small = os.path.join(d.mnt, "small")
    fd = os.open(small, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, os.urandom(4 * KiB))
    finally:
        os.close(fd)
    assert kinds(d, "small") == ["create"]
    info = d.cli_json("info", "small")
    assert (info["state"], info["size"]) == ("ready", 4 * KiB)
    assert d.cli_json("check")["clean"]

    sized = os.path.join(d.mnt, "sized")
    open(sized, "wb").close()
    os.truncate(sized, 8 * KiB)                  # sized by a setattr: a resize
    assert kinds(d, "sized") == ["create", "resize"]

    with open(small, "r+b") as f:                # past its 4 KiB slot: new memory
        f.seek(0, os.SEEK_END)
        f.write(os.urandom(256 * KiB))
    assert "resize" in kinds(d, "small")
    assert d.cli_json("info", "small")["size"] == 260 * KiB
    assert d.cli_json("check")["clean"]
