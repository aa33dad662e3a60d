"""Parity encoded while a load copies (issue 29), on the host backend (numpy codec), against a
real gpumemd: `gpumemctl load --ecc rs` reports the bytes it has written as it goes (op
`refill_written`) and the daemon encodes their parity meanwhile; the close encodes the rest.
What a user sees: the bytes read back as the file's, `verify` clean, a load killed half way
leaves nothing, and the rule for reported bytes (docs/protocol.md, "Snapshots"): a report
encodes the bytes as they are then; bytes written again must be reported again or named in
the close's `written`, and a client that hides such a write has stale parity in its own
allocation only, which `verify` then reports there.
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpumemctl.protocol import GpumemError, NotFound, UsageError
from gpumemctl.refillreport import REPORT_HOST
from tests.harness import PYTHON, ROOT, child_env, script_argv, wait_for
from tests.users import run_as

MiB, BLOCK = 1 << 20, 128 * 1024
N = 24      # blocks: memory of its own (a slab's slots go to 1 MiB, their parity is shared)


def verify(d, name: str, code: int) -> dict:
    return json.loads(d.cli("verify", name, "--json", check=code).stdout)["allocations"][0]


def big_model(path, nbytes: int) -> bytes:
    """A safetensors file of one uint8 tensor of `nbytes` random bytes; returns them."""
    data = np.frombuffer(os.urandom(nbytes), np.uint8)
    save_file({"w": data}, str(path))
    return data.tobytes()


def read_back(d, name: str) -> bytes:
    with d.client() as c, c.open(name) as h:
        return h.read()


def test_a_load_that_reports_as_it_copies_reads_back_equal_and_verifies_clean(
        daemon, tmp_path):
    """Three reports' worth and a tail: most parity is encoded during the copy, the rest at
    the close, and every block's parity matches the bytes."""
    data = big_model(tmp_path / "m.safetensors", 2 * REPORT_HOST + 3 * MiB + 77)
    out = daemon.cli_json("load", str(tmp_path / "m.safetensors"), "m", "--durable")
    assert out["bytes"] == len(data)
    info = daemon.cli_json("info", "m")
    assert (info["state"], info["ecc"], info["durable"]) == ("ready", "rs", True)
    assert read_back(daemon, "m") == data
    result = verify(daemon, "m", code=0)
    assert result["clean"] == result["blocks"] == -(-len(data) // BLOCK)
    assert "'m': parity of blocks 0-" in daemon.log()      # (a debug line) during the copy


def test_ecc_none_loads_as_before(daemon, tmp_path):
    data = big_model(tmp_path / "m.safetensors", 2 * REPORT_HOST + 5)
    daemon.cli("load", str(tmp_path / "m.safetensors"), "m", "--ecc", "none", check=True)
    assert daemon.cli_json("info", "m")["ecc"] == "none"
    assert read_back(daemon, "m") == data


def _refill(c, name: str, data: bytes, ecc: str = "rs"):
    """A refill handle on a new `name` with `data` written (nothing reported yet)."""
    h = c.refill(name, size=len(data), ecc=ecc)
    h.write(data)
    h._ranges, h._written = [], None        # the close declares only what a test says
    return h


def _finish(h, written: list[list[int]]) -> None:
    for start, end in written:
        h._note_write(start, end - start)
    h.restored = {"damaged": []}
    h.close()


def report(c, h, *ranges: list[int]) -> list[list[int]]:
    return c.call("refill_written", handle=h.id, ranges=list(ranges))["encoded"]


def test_reports_encode_whole_blocks_and_the_close_encodes_the_rest(daemon):
    data = os.urandom(N * BLOCK + 100)
    with daemon.client() as c:
        h = _refill(c, "r", data)
        assert report(c, h, [0, BLOCK + 10]) == [[0, BLOCK]]          # block 1 not whole
        assert report(c, h, [BLOCK + 10, 2 * BLOCK + 5]) == [[0, 2 * BLOCK]]
        assert report(c, h, [4 * BLOCK, len(data)]) == [[0, 2 * BLOCK],
                                                        [4 * BLOCK, len(data)]]
        assert c.info("r")["state"] == "restoring"       # not served before its close
        _finish(h, [[2 * BLOCK, 4 * BLOCK]])              # what was not encoded
    assert read_back(daemon, "r") == data
    assert verify(daemon, "r", code=0)["clean"] == N + 1


def test_bytes_written_again_and_reported_again_or_declared_verify_clean(daemon):
    """The rule's honest sides: a block written again after its report is encoded again
    when it is reported again, or when the close's `written` names it."""
    data = bytearray(os.urandom(N * BLOCK))
    with daemon.client() as c:
        h = _refill(c, "again", bytes(data))
        report(c, h, [0, len(data)])
        data[BLOCK + 5:BLOCK + 9] = b"new!"
        h.memory.write(BLOCK + 5, b"new!")              # (not noted for the close)
        report(c, h, [BLOCK + 5, BLOCK + 9])            # touches block 1: encoded again
        _finish(h, [])
        again = bytes(data)
        h = _refill(c, "declared", bytes(data))
        report(c, h, [0, len(data)])
        data[3 * BLOCK:3 * BLOCK + 4] = b"more"
        h.memory.write(3 * BLOCK, b"more")
        _finish(h, [[3 * BLOCK, 3 * BLOCK + 4]])
    verify(daemon, "again", code=0)
    assert read_back(daemon, "again") == again
    verify(daemon, "declared", code=0)
    assert read_back(daemon, "declared") == bytes(data)


def test_a_client_that_hides_a_rewrite_damages_only_its_own_allocation(daemon):
    """A report says its bytes are final. A client that writes them again and says nothing
    has parity that does not match them: `verify` reports that block in its allocation (its
    own data's problem: the bytes are still what it wrote, recorded damaged, as any damage
    a verify without --repair finds), and no other allocation is touched."""
    honest = os.urandom(N * BLOCK)
    with daemon.client() as c:
        h = _refill(c, "honest", honest)
        report(c, h, [0, len(honest)])
        _finish(h, [])
        h = _refill(c, "liar", os.urandom(N * BLOCK))
        report(c, h, [0, N * BLOCK])
        h.memory.write(BLOCK, os.urandom(BLOCK))        # block 1 again, never said
        _finish(h, [])
    assert verify(daemon, "liar", code=8)["damaged"] == [1]
    assert verify(daemon, "honest", code=0)["clean"] == N
    assert read_back(daemon, "honest") == honest


def test_a_report_is_only_for_a_refill_handle_and_its_bytes(daemon):
    with daemon.client() as c:
        c.create("plain", 4096)
        with c.open("plain", "rw") as h:
            try:
                c.call("refill_written", handle=h.id, ranges=[[0, 4096]])
                raise AssertionError("a plain write handle took a report")
            except UsageError as exc:
                assert "not a refill handle" in exc.message
        h = _refill(c, "r", os.urandom(N * BLOCK))
        for bad in ([[0, N * BLOCK + 1]], [[5, 5]], [[-1, 3]], [[0]], [[0, True]]):
            try:
                report(c, h, *bad)
                raise AssertionError(f"{bad} was taken")
            except UsageError as exc:
                assert "invalid" in exc.message
        _finish(h, [[0, N * BLOCK]])
        try:
            c.call("refill_written", handle=h.id, ranges=[[0, 1]])
            raise AssertionError("a closed handle took a report")
        except NotFound:
            pass
        h = _refill(c, "none", os.urandom(N * BLOCK), ecc="none")
        assert report(c, h, [0, N * BLOCK]) == []       # no parity: nothing to encode
        _finish(h, [[0, N * BLOCK]])
        h = _refill(c, "small", os.urandom(4 * BLOCK))    # a slot: its slab's parity
        assert report(c, h, [0, 4 * BLOCK]) == []       # is encoded whole at the close
        _finish(h, [[0, 4 * BLOCK]])
    verify(daemon, "r", code=0)
    verify(daemon, "small", code=0)


KILLED = textwrap.dedent("""
    import os, signal, sys
    from gpumemctl import Client
    c = Client(sys.argv[1])
    h = c.refill("half", size=32 * 131072, ecc="rs", durable=True)
    h.write(os.urandom(16 * 131072))
    assert c.call("refill_written", handle=h.id,
                  ranges=[[0, 16 * 131072]])["encoded"] == [[0, 16 * 131072]]
    print("reported", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_load_killed_after_reports_leaves_nothing(daemon):
    """Parity encoded for half of it, then SIGKILL: the refill never finished, so the
    allocation it made is removed with the session, as any refill's."""
    proc = subprocess.run([PYTHON, "-c", KILLED, daemon.socket], capture_output=True,
                          text=True, env=child_env(), cwd=ROOT, timeout=60)
    assert proc.returncode == -9 and proc.stdout == "reported\n", proc.stderr

    def gone() -> bool:
        try:
            daemon.cli_json("info", "half")
        except AssertionError:
            return True
        return False
    wait_for(gone, what="the daemon to remove the unfinished refill")
    assert daemon.cli_json("status")["totals"]["allocations"] == 0


def test_the_cli_load_killed_half_way_leaves_nothing(daemon, tmp_path):
    """kill -9 of `gpumemctl load` while it copies (reports in flight or done)."""
    big_model(tmp_path / "m.safetensors", 6 * REPORT_HOST)
    proc = subprocess.Popen(script_argv("gpumemctl") + ["--socket", daemon.socket, "load",
                            str(tmp_path / "m.safetensors"), "m"], env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with daemon.client() as c:
            def restoring() -> bool:
                try:
                    return c.info("m")["state"] == "restoring"
                except NotFound:
                    return False
            wait_for(restoring, timeout=60, interval=0.002, what="the load to begin")
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: daemon.cli_json("ls") == [], what="the daemon to remove the load's "
             "allocation")
    assert daemon.cli_json("status")["totals"]["allocations"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_another_uid_cannot_report_into_roots_refill(daemon):
    """A handle is its session's: uid 65534 naming root's refill handle in its own session
    (handle ids are small integers, easy to guess) is refused, and root's load verifies
    clean afterwards, every block of it encoded from root's own bytes."""
    data = os.urandom(N * BLOCK)
    with daemon.client() as c:
        h = _refill(c, "roots", data)

        def as_nobody():
            from gpumemctl import Client
            with Client(daemon.socket) as other:
                try:
                    other.call("refill_written", handle=h.id, ranges=[[0, N * BLOCK]])
                except GpumemError as exc:
                    return type(exc).__name__
            return "taken"
        assert run_as(as_nobody) == "NotFound"
        _finish(h, [[0, N * BLOCK]])
    assert read_back(daemon, "roots") == data
    assert verify(daemon, "roots", code=0)["clean"] == N
