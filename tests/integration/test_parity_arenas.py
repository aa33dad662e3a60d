"""Parity arenas on a running gpumemd (issue 26, docs/storage.md "Parity arenas"): the
parity of every owner's allocations shares a few arenas, so no client of any uid may ever be
handed one; the parity they hold survives a kill -9 (damage made before the kill is still
found after it); status and the metrics show them; the layout before keeps working."""
from __future__ import annotations

import ctypes  # noqa: F401 - the client's mappings need it; the other uid cannot import it
import json
import mmap  # noqa: F401 - as ctypes
import os

import pytest

import gpumemctl.memory  # noqa: F401 - as ctypes
from gpumemctl import Client
from tests.users import run_as

KiB, MiB = 1 << 10, 1 << 20


def _fds_handed_out(socket: str, own: list[str], others: list[str]) -> list[str]:
    """As a hostile client: every op that hands out descriptors, on one's own allocations
    and on another's world-readable ones; what each fd is (its /proc link)."""
    seen = []
    with Client(socket) as c:
        for path in own + others:
            for op, args in (("attach", {"mode": "r", "regions": True}),
                             ("open", {"mode": "r", "regions": True}),
                             ("attach", {"mode": "w", "regions": True}),
                             ("open", {"mode": "rw", "regions": True})):
                try:
                    result, fds = c.call_fds(op, path=path, **args)
                except Exception as exc:  # noqa: BLE001 - refused: nothing handed out
                    seen.append(f"{op} {path}: refused ({type(exc).__name__})")
                    continue
                for fd in fds:
                    seen.append(os.readlink(f"/proc/self/fd/{fd}"))
                    os.close(fd)
                handle = result.get("handle")
                if handle is not None:
                    c.call("detach" if op == "attach" else "close", handle=handle)
    return seen


def _make(socket: str) -> None:
    with Client(socket) as c:
        for name, size in (("a/small", 4 * KiB), ("a/big", 2 * MiB)):
            c.create(name, size, durable=True, mode=0o644)
            c.write(name, b"x" * size)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_no_client_of_any_uid_is_ever_handed_a_parity_arena(daemon):
    d = daemon
    d.cli("mkdir", "--mode", "1777", "a", check=True)
    run_as(_make, d.socket, uid=1000, gid=1000)
    assert d.cli_json("status")["devices"][0]["parity_arenas"]["count"] >= 1
    mine = run_as(_fds_handed_out, d.socket, ["a/small", "a/big"], [], uid=1000, gid=1000)
    theirs = run_as(_fds_handed_out, d.socket, [], ["a/small", "a/big"], uid=1001,
                    gid=1001)
    roots = _fds_handed_out(d.socket, ["a/small", "a/big"], [])
    handed = [s for s in mine + theirs + roots if s.startswith("/")]    # fds, not refusals
    assert handed, (mine, theirs, roots)            # descriptors were handed out ...
    assert not [s for s in handed if "parity" in s], handed      # ... never a parity's


def test_the_parity_in_arenas_survives_a_kill_and_still_finds_earlier_damage(ecc_daemon):
    d = ecc_daemon
    with d.client() as c:
        for i in range(6):
            c.create(f"w/{i}", 2 * MiB, durable=True)
            c.write(f"w/{i}", bytes([65 + i]) * (2 * MiB))
    dev = d.cli_json("status")["devices"][0]
    arenas = dev["parity_arenas"]
    assert arenas["count"] == 1 and arenas["spans"] == 6
    assert arenas["used_bytes"] == 6 * 132 * KiB        # not 6 granules of parity
    held = d.cli_json("status")["keeper"]["held"]
    assert held == 6 + 1                                # the allocations and one arena
    d.cli("debug", "corrupt", "w/3", "--offset", "1000", "--length", "4", check=True)
    d.kill9()
    d.start()
    assert "rebuilding it from the data" not in d.log()
    found = d.cli("verify", "w/3", "--json", check=8)          # found, not repaired
    assert json.loads(found.stdout)["allocations"][0]["damaged"] == [0]
    d.cli("verify", "--all", "--repair", check=1)              # repaired
    d.cli("verify", "--all", check=0)
    with d.client() as c:
        for i in range(6):
            assert c.read(f"w/{i}") == bytes([65 + i]) * (2 * MiB)
    metrics = d.cli("metrics", check=True).stdout.decode()
    assert "gpumemd_parity_arena_spans{" in metrics
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def test_a_daemon_of_the_layout_before_restarted_with_arenas_keeps_every_byte(
        daemon_factory):
    d = daemon_factory(extra_args=["--parity-arenas", "off"])
    with d.client() as c:
        c.create("old", 4 * MiB, durable=True)
        c.write("old", b"o" * (4 * MiB))
    assert d.cli_json("status")["devices"][0]["parity_arenas"]["count"] == 0
    d.kill9()
    d.extra_args = []                                   # arenas on, as by default
    d.start()
    with d.client() as c:
        c.create("new", 2 * MiB, durable=True)
        c.write("new", b"n" * (2 * MiB))
        assert c.read("old") == b"o" * (4 * MiB)
    assert d.cli_json("status")["devices"][0]["parity_arenas"]["spans"] == 1
    d.kill9()
    d.start()
    d.cli("verify", "--all", check=0)
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]


def test_orphans_re_registered_keep_their_ecc_though_their_parity_was_a_span(daemon):
    """--adopt-orphans after the registry went: an allocation whose parity was a span of an
    arena (no parity fd in its deposit) comes back with ECC rs, its parity rebuilt."""
    d = daemon
    with d.client() as c:
        c.create("p", 2 * MiB, durable=True)
        c.write("p", b"p" * (2 * MiB))
    d.kill9()
    for name in os.listdir(d.state_dir):
        if name.startswith("registry.sqlite"):
            os.unlink(os.path.join(d.state_dir, name))
    d.extra_args = ["--adopt-orphans"]
    d.start()
    d.extra_args = []
    [entry] = [e for e in d.cli_json("ls", "-R") if e["type"] == "allocation"]
    assert entry["ecc"] == "rs" and entry["durable"]
    with d.client() as c:
        assert c.read(entry["path"]) == b"p" * (2 * MiB)
    d.cli("verify", "--all", check=0)
