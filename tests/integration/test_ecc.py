"""ECC through the daemon (host backend, numpy codec): verify, repair, recover, fault
injection, degraded allocations reading as errors, and the exit codes scripts see."""
from __future__ import annotations

import errno
import json
import os

import pytest

from tests.harness import store_random as make

MiB, BLOCK = 1 << 20, 128 * 1024


def verify(d, *args, code: int):
    out = d.cli("verify", *args, "--json", check=code).stdout
    return json.loads(out)


def corrupt(d, name, offset, length, *extra):
    d.cli("debug", "corrupt", name, "--offset", str(offset), "--length", str(length),
          *extra, check=True)


def test_clean_verify_and_quiet(ecc_daemon):
    d = ecc_daemon
    make(d, "a")
    make(d, "b", durable=False)
    result = verify(d, "--all", code=0)
    assert result["summary"]["exit"] == 0 and result["summary"]["blocks"] == 64
    assert d.cli("verify", "--all", "--quiet", check=0).stdout == b""
    text = d.cli("verify", "a", check=0).stdout.decode()
    assert "a: 32 blocks, 32 clean" in text


def test_correctable_damage_is_found_then_repaired(ecc_daemon):
    d = ecc_daemon
    data = make(d, "a")
    corrupt(d, "a", 5000, 100, "--pattern", "00ff")
    corrupt(d, "a", 3 * BLOCK + 77, 4096)                     # a whole 4 KiB burst
    found = verify(d, "a", code=8)                            # found, not repaired
    assert found["allocations"][0]["damaged"] == [0, 3]
    assert d.cli("read", "a", check=8).stdout == b""         # recorded: EIO until repaired
    fixed = verify(d, "a", "--repair", code=1)
    r = fixed["allocations"][0]
    assert (r["corrected"], r["uncorrectable"]) == (2, 0) and r["symbols"] > 4096
    assert d.cli("read", "a", check=True).stdout == data
    verify(d, "a", code=0)
    assert {"corrupt"} <= {e["kind"] for e in d.cli_json("events")}


def test_corrupted_parity_is_repaired(ecc_daemon):
    d = ecc_daemon
    data = make(d, "a")
    corrupt(d, "a", 8192 + 10, 3000, "--parity")          # block 1's parity
    verify(d, "a", code=8)
    verify(d, "a", "--repair", code=1)
    verify(d, "a", code=0)
    assert d.cli("read", "a", check=True).stdout == data


def test_uncorrectable_block_degrades_and_reads_fail(mounted_factory):
    d = mounted_factory(extra_args=["--enable-fault-injection"])
    d.allow_errors = True
    data = make(d, "a", durable=True)
    corrupt(d, "a", 2 * BLOCK, BLOCK, "--pattern", "5a")    # every byte of block 2
    result = verify(d, "a", "--repair", code=8)
    r = result["allocations"][0]
    assert r["uncorrectable"] == 1 and r["damaged_ranges"] == [[2 * BLOCK, 3 * BLOCK]]
    info = d.cli_json("info", "a")
    assert info["state"] == "degraded" and info["damaged"] == [[2 * BLOCK, 3 * BLOCK]]
    # The damaged range reads as EIO through the mount; the rest still reads. (Unbuffered:
    # a buffered reader asks for st_blksize = 1 MiB at a time, which spans the damage.)
    with open(os.path.join(d.mnt, "a"), "rb", buffering=0) as f:
        assert f.read(2 * BLOCK) == data[:2 * BLOCK]
        with pytest.raises(OSError) as exc:
            f.read(BLOCK)
        assert exc.value.errno == errno.EIO
        f.seek(3 * BLOCK)
        assert f.read() == data[3 * BLOCK:]
    err = d.cli("read", "a", check=8).stderr.decode()         # and as an error, exit 8
    assert "damaged beyond repair" in err and "gpumemctl recover" in err
    assert "damage" in [e["kind"] for e in d.cli_json("events")]
    assert d.cli("recover", "a", check=8).stdout.decode().endswith(
        "recover: 'a' is degraded; 1 damaged range(s) remain\n")
    # It stays degraded across a crash, then a write of the whole block heals it.
    d.kill9()
    d.start()
    assert d.cli_json("info", "a")["state"] == "degraded"
    with open(os.path.join(d.mnt, "a"), "r+b") as f:
        f.seek(2 * BLOCK)
        f.write(data[2 * BLOCK:3 * BLOCK])
    assert d.cli_json("info", "a")["state"] == "ready"
    assert d.cli("recover", "a", check=0).stdout.decode().endswith("recover: 'a' is ready\n")
    assert d.cli("read", "a", check=True).stdout == data


def test_writes_keep_parity_current(mounted_factory):
    d = mounted_factory()
    path = os.path.join(d.mnt, "f")
    with open(path, "wb") as f:
        f.write(os.urandom(3 * MiB + 5))
    with open(path, "r+b") as f:
        f.seek(100_000)
        f.write(b"x" * 70_000)
        f.flush()
        os.fsync(f.fileno())
        verify(d, "f", code=0)                     # fsync made the parity current
        f.seek(4 * MiB)                            # growing past the capacity
        f.write(b"tail")
    verify(d, "f", code=0)                         # so did close
    d.cli("create", "g", "--size", "1M", check=True)
    with d.client() as c:
        with c.open("g", "rw") as h:
            h.write(b"through the socket", offset=1000)
    verify(d, "g", code=0)


def test_ecc_none_and_fault_injection_refused(daemon_factory):
    d = daemon_factory()
    d.cli("create", "plain", "--size", "1M", "--ecc", "none", check=True)
    d.cli("create", "safe", "--size", "1M", check=True)
    assert d.cli_json("info", "plain")["ecc"] == "none"
    lines = [ln.split() for ln in d.cli("ls", "-l", check=True).stdout.decode().splitlines()]
    assert [ln[7] for ln in lines] == ["ECC", "none", "rs"]
    r = verify(d, "--all", code=0)["allocations"]
    assert [(x["path"], x.get("skipped_reason")) for x in r] == [("plain", "no ECC"),
                                                                 ("safe", None)]
    err = d.cli("debug", "corrupt", "safe", "--offset", "0", "--length", "1",
                check=6).stderr.decode()
    assert "--enable-fault-injection" in err


def test_bad_corrupt_arguments(ecc_daemon):
    d = ecc_daemon
    make(d, "a", size=MiB)
    assert b"invalid range" in d.cli("debug", "corrupt", "a", "--offset", "3M",
                                     "--length", "1", check=2).stderr
    assert b"invalid pattern" in d.cli("debug", "corrupt", "a", "--pattern", "zz",
                                       check=2).stderr
    d.cli("verify", "nothere", check=4)
    d.cli("verify", check=2)                       # neither names nor --all


def test_writes_in_flight_at_a_crash_keep_their_data(mounted_factory):
    """A durable file written through the mount and not yet closed when gpumemd dies: its
    parity is rebuilt from the data at the next start (the writes are not "repaired" away),
    and damage found before the crash elsewhere is still found after it."""
    d = mounted_factory(extra_args=["--enable-fault-injection"])
    data = bytearray(make(d, "f"))
    make(d, "other")
    d.cli("debug", "corrupt", "other", "--offset", "10", "--length", "10", check=True)
    fd = os.open(os.path.join(d.mnt, "f"), os.O_RDWR)
    os.pwrite(fd, b"new" * 1000, 5000)
    data[5000:8000] = b"new" * 1000
    d.kill9()
    try:
        os.close(fd)
    except OSError:
        pass                       # the dead mount may say ENOTCONN: the fd is gone anyway
    d.start()
    verify(d, "f", code=0)
    assert d.cli("read", "f", check=True).stdout == bytes(data)
    assert "parity" in [e["kind"] for e in d.cli_json("events")]
    verify(d, "other", "--repair", code=1)


def test_verified_time_is_recorded_and_survives_a_restart(ecc_daemon):
    """`info` shows when an allocation was last verified in full: null before, a time
    after a verify, kept across a kill -9 (the TUI's "last verified" column)."""
    d = ecc_daemon
    make(d, "v/a", 2 * MiB)
    make(d, "v/plain", MiB, durable=True)
    d.cli("create", "v/none", "--size", "1M", "--ecc", "none", "--durable", check=True)
    assert d.cli_json("info", "v/a")["verified"] is None
    verify(d, "v", code=0)
    first = d.cli_json("info", "v/a")["verified"]
    assert first is not None and first.endswith("Z")
    assert d.cli_json("info", "v/none")["verified"] is None      # nothing to verify
    d.restart(hard=True)
    assert d.cli_json("info", "v/a")["verified"] == first
    verify(d, "v/a", code=0)
    assert d.cli_json("info", "v/a")["verified"] > first


def test_a_writers_close_encodes_the_ranges_it_declared(ecc_daemon):
    """A socket writer's close encodes the span its handle reports (Handle.write notes it),
    not the whole allocation: bytes written through the mapping and not declared keep their
    old parity, which verify then finds in that allocation and no other."""
    d = ecc_daemon
    data = bytearray(make(d, "a", size=16 * MiB))
    make(d, "b")
    with d.client() as c:
        with c.open("a", "rw") as h:
            h.write(b"\x5a" * 4096, 3 * BLOCK + 10)            # declared: block 3
            h.memory.write(9 * BLOCK, b"\xa5" * 4096)          # not declared: block 9
    with d.client() as c:
        with c.open("a", "rw") as h:                            # wrote nothing, declared none
            h.memory.write(12 * BLOCK, b"\x11" * 100)
    data[3 * BLOCK + 10:3 * BLOCK + 10 + 4096] = b"\x5a" * 4096
    found = verify(d, "a", code=8)
    assert found["allocations"][0]["damaged"] == [9, 12]
    verify(d, "b", code=0)
    # Repair brings back what the parity knew: the undeclared bytes were the writer's own.
    verify(d, "a", "--repair", code=1)
    assert d.cli("read", "a", check=True).stdout == bytes(data)
