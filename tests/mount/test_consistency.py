"""docs/mount.md, "Consistency": each rule of the mount's page cache against the other paths
to the same memory (the socket API's read/write, open rw + close, attach rw + seal/detach),
on a real mount (host backend in CI). Each test names the rule it holds.
"""
from __future__ import annotations

import mmap
import os
import subprocess

import gpumemctl

PAGE, MiB = 4096, 1 << 20


def make(mnt: str, name: str, data: bytes) -> str:
    path = os.path.join(mnt, name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def cat(path: str) -> bytes:
    return subprocess.run(["cat", path], check=True, capture_output=True).stdout


def fully_synced(client, name: str) -> bool:
    """Whether the parity covers every byte: a verify judges all blocks, skips none."""
    result = client.verify([name])["allocations"][0]
    return result["skipped"] == 0 and result["uncorrectable"] == 0 and result["blocks"] > 0


# ---- 1. write(2) through the mount -----------------------------------------------------------
def test_1_a_write_is_in_device_memory_when_write_returns(mounted):
    path = make(mounted.mnt, "f", b"a" * (2 * PAGE))
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"written", PAGE - 3)              # across a page boundary
        with mounted.client() as c:                      # no fsync, no close yet
            assert c.read("f", PAGE - 3, 7) == b"written"
    finally:
        os.close(fd)


# ---- 2. stores into a shared mapping ---------------------------------------------------------
def test_2_mapped_stores_reach_device_memory_at_msync_with_parity(mounted):
    path = make(mounted.mnt, "f", b"a" * (3 * PAGE))
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, 3 * PAGE)
    try:
        m[PAGE - 2:PAGE + 3] = b"hello"
        m.flush()                                        # msync(MS_SYNC)
        with mounted.client() as c:
            assert c.read("f", PAGE - 2, 5) == b"hello"
            assert fully_synced(c, "f")                  # msync is an fsync: parity follows
    finally:
        m.close()
        os.close(fd)


def test_2_mapped_stores_reach_device_memory_at_fsync_close_and_munmap(mounted):
    path = make(mounted.mnt, "f", b"a" * (3 * PAGE))
    fd = os.open(path, os.O_RDWR)
    m = mmap.mmap(fd, 3 * PAGE)
    with mounted.client() as c:
        m[0:5] = b"fsync"
        os.fsync(fd)
        assert c.read("f", 0, 5) == b"fsync"
        m[PAGE:PAGE + 5] = b"close"
        os.close(fd)                                     # the mapping stays
        assert c.read("f", PAGE, 5) == b"close"
        m[2 * PAGE:2 * PAGE + 6] = b"munmap"
        m.close()
        assert c.read("f", 2 * PAGE, 6) == b"munmap"
        assert c.read("f", 0, 5) + c.read("f", PAGE, 5) == b"fsyncclose"
    assert cat(path) == b"fsync" + b"a" * (PAGE - 5) + b"close" + b"a" * (PAGE - 5) + \
        b"munmap" + b"a" * (PAGE - 6)


def test_2_a_mapping_and_read_see_a_write_through_the_mount_at_once(mounted):
    path = make(mounted.mnt, "f", b"a" * (2 * PAGE))
    reader = os.open(path, os.O_RDONLY)
    m = mmap.mmap(reader, 2 * PAGE, prot=mmap.PROT_READ)
    try:
        assert m[:4] == b"aaaa"
        writer = os.open(path, os.O_WRONLY)
        os.pwrite(writer, b"bbbb", 0)
        os.close(writer)
        assert m[:4] == b"bbbb" and os.pread(reader, 4, 0) == b"bbbb"
    finally:
        m.close()
        os.close(reader)


# ---- 3. a socket writer: write, open rw + close ----------------------------------------------
def test_3_socket_write_then_mapped_read_and_read_of_the_same_page(mounted):
    path = make(mounted.mnt, "f", b"a" * (2 * PAGE))
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, 2 * PAGE, prot=mmap.PROT_READ)
    try:
        assert m[:4] == b"aaaa" and os.pread(fd, 4, 0) == b"aaaa"     # cached now
        with mounted.client() as c:
            c.write("f", b"NEW!", 0)                     # open rw, write, close
            assert m[:4] == b"NEW!"
            assert os.pread(fd, 4, 0) == b"NEW!"
            with c.open("f", "rw") as h:
                h.write(b"HAND", PAGE + 8)
                # Before its close the cache may still hold the old page (rule 5).
            assert os.pread(fd, 4, PAGE + 8) == b"HAND"
            assert m[PAGE + 8:PAGE + 12] == b"HAND"
    finally:
        m.close()
        os.close(fd)


def test_3_a_cached_file_rewritten_through_the_socket_reads_new_bytes(mounted):
    old, new = os.urandom(MiB), os.urandom(MiB)
    path = make(mounted.mnt, "f", old)
    for _ in range(2):                                   # the second read is from the cache
        with open(path, "rb") as fh:
            assert fh.read() == old
    with mounted.client() as c:
        c.write("f", new)
    with open(path, "rb") as fh:
        assert fh.read() == new
    assert cat(path) == new


# ---- 4. an attached writer: seal and detach --------------------------------------------------
def test_4_attached_writer_then_cat_and_read_after_seal_and_detach(mounted):
    path = make(mounted.mnt, "f", b"a" * (2 * PAGE))
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, 2 * PAGE, prot=mmap.PROT_READ)
    try:
        assert os.pread(fd, 4, 0) == b"aaaa" and m[PAGE:PAGE + 4] == b"aaaa"  # cached
        a = gpumemctl.attach("f", "rw", mounted.socket)
        a.write(b"SEAL", 0)
        a.write(b"seal", PAGE)
        a.seal()
        assert os.pread(fd, 4, 0) == b"SEAL" and m[PAGE:PAGE + 4] == b"seal"
        assert cat(path)[:4] == b"SEAL"
        a.write(b"DTCH", 0)
        a.detach()
        assert os.pread(fd, 4, 0) == b"DTCH" and m[:4] == b"DTCH"
        assert cat(path)[:4] == b"DTCH"
    finally:
        m.close()
        os.close(fd)


# ---- 5. while a socket client holds the file for writing -------------------------------------
def test_5_an_open_during_an_attached_writer_reads_device_memory(mounted):
    path = make(mounted.mnt, "f", b"a" * PAGE)
    assert cat(path)[:4] == b"aaaa"                      # cached, and kept by the next open
    with gpumemctl.attach("f", "rw", mounted.socket) as a:
        a.write(b"LIVE", 0)
        assert cat(path)[:4] == b"LIVE"                  # unsealed, yet read from the memory
        a.write(b"MORE", 0)
        assert cat(path)[:4] == b"MORE"
    assert cat(path)[:4] == b"MORE"


# ---- 6. size ---------------------------------------------------------------------------------
def test_6_rm_and_create_through_the_socket_then_stat_and_read(mounted):
    path = make(mounted.mnt, "f", b"a" * (3 * PAGE))
    assert os.stat(path).st_size == 3 * PAGE and cat(path) == b"a" * (3 * PAGE)   # cached
    with mounted.client() as c:
        c.remove("f")
        c.create("f", 100)
        c.write("f", b"x" * 100)
    assert os.stat(path).st_size == 100
    assert cat(path) == b"x" * 100


def test_6_a_truncate_through_the_mount_under_a_mapping_and_an_open_file(mounted):
    path = make(mounted.mnt, "f", b"a" * (3 * PAGE))
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, 3 * PAGE, prot=mmap.PROT_READ)
    try:
        assert m[:4] == b"aaaa"
        os.truncate(path, PAGE)
        assert os.fstat(fd).st_size == PAGE
        assert os.pread(fd, 3 * PAGE, 0) == b"a" * PAGE
        with mounted.client() as c:
            assert c.info("f")["size"] == PAGE
        os.truncate(path, 2 * PAGE)                      # the grown page reads as zeros
        assert os.pread(fd, 3 * PAGE, 0) == b"a" * PAGE + bytes(PAGE)
        assert m[PAGE:PAGE + 4] == bytes(4)
    finally:
        m.close()
        os.close(fd)


def test_6_a_socket_client_reads_a_truncate_and_o_trunc_at_once(mounted):
    path = make(mounted.mnt, "f", b"a" * (3 * PAGE))
    with mounted.client() as c:
        os.truncate(path, 10)
        assert c.read("f") == b"a" * 10
        with open(path, "wb") as fh:                     # O_TRUNC, then a write
            fh.write(b"b" * 5)
        assert c.read("f") == b"b" * 5
