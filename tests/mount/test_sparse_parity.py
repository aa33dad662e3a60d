"""A write past the end that leaves a gap zeroes the gap, and the gap's blocks are encoded
with the write: a file shrunk within its capacity keeps its old bytes past the new size
(undefined, unprotected), and a later sparse write must not leave them under parity that
verify would call damage, nor that a repair would put back where the file reads zeros."""
from __future__ import annotations

import json
import os

MiB = 1 << 20


def test_a_sparse_write_after_a_shrink_leaves_the_gap_zeros_and_verifiable(mounted):
    d = mounted
    path = os.path.join(d.mnt, "f")
    with open(path, "wb") as f:
        f.write(b"\xab" * (2 * MiB))                     # memory of its own, 2 MiB
    os.truncate(path, 3 * MiB // 2)                      # same capacity: the memory stays
    with open(path, "r+b") as f:
        f.seek(1900 * 1024)
        f.write(b"\xcd" * 4096)                          # a gap of 1.5 MiB .. 1900 KiB
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        data = f.read()
    assert data[:3 * MiB // 2] == b"\xab" * (3 * MiB // 2)
    assert data[3 * MiB // 2:1900 * 1024] == bytes(1900 * 1024 - 3 * MiB // 2)
    assert data[1900 * 1024:] == b"\xcd" * 4096
    found = json.loads(d.cli("verify", "f", "--json", check=0).stdout)
    assert found["allocations"][0]["damaged"] == []
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]
