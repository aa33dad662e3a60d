"""User metadata (issue 17) against a real gpumemd: `gpumemctl meta` and the client library,
the bytes a key and a value carry, both bounds from the configuration file, hard links, a
`kill -9` of the daemon, and what a second uid may and may not do (tests/users.py)."""
from __future__ import annotations

import json
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.users import run_as

USAGE, NOT_FOUND, EXISTS, PERMISSION, NO_MEMORY = 2, 4, 5, 6, 7
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def one_line(proc) -> str:
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_cli_sets_gets_lists_and_removes(daemon):
    d = daemon
    d.cli("create", "models/a", "--size", "4096", check=True)
    assert d.cli("meta", "set", "models/a", "format", "safetensors", check=True).stdout == b""
    assert d.cli("meta", "get", "models/a", "format", check=True).stdout == b"safetensors\n"
    d.cli("meta", "set", "models/a", "index", "-", input=b'{"w": [0, 8]}\n', check=True)
    assert d.cli("meta", "ls", "models/a", check=True).stdout == \
        b'format=safetensors\nindex={"w": [0, 8]}\\n\n'        # escaped for a person
    assert d.cli("meta", "get", "models/a", "index", check=True).stdout == \
        b'{"w": [0, 8]}\n\n'                                    # a pipe gets the bytes
    # --json: the answers of docs/protocol.md
    assert d.cli_json("meta", "ls", "models/a") == {
        "path": "models/a", "metadata": {"format": "safetensors", "index": '{"w": [0, 8]}\n'}}
    assert d.cli_json("meta", "get", "models/a", "format") == {
        "path": "models/a", "key": "format", "value": "safetensors"}
    assert d.cli_json("meta", "set", "models/a", "empty", "") == {
        "path": "models/a", "key": "empty", "bytes": 0}
    assert d.cli_json("meta", "rm", "models/a", "empty") == {"path": "models/a", "key": "empty"}
    info = d.cli_json("info", "models/a")
    assert info["metadata"] == {"format": "safetensors", "index": '{"w": [0, 8]}\n'}
    assert all("metadata" not in e for e in d.cli_json("ls", "-R"))
    human = d.cli("info", "models/a", check=True).stdout.decode().splitlines()
    assert "metadata           format (11 B), index (14 B)" in human
    # exit codes, each with one line on stderr
    err = one_line(d.cli("meta", "set", "models/a", "gpu.size", "1", check=USAGE))
    assert "'gpu.size'" in err and "reserved" in err
    err = one_line(d.cli("meta", "get", "models/a", "k" * 251, check=USAGE))
    assert "251 bytes, at most 250" in err
    err = one_line(d.cli("meta", "get", "models/a", "nope", check=NOT_FOUND))
    assert err == "gpumemctl: error: no metadata key 'nope' on 'models/a'"
    d.cli("meta", "rm", "models/a", "nope", check=NOT_FOUND)
    d.cli("meta", "ls", "models/nothing", check=NOT_FOUND)
    d.cli("meta", "set", "models/a", "new", "x", "--replace", check=NOT_FOUND)
    err = one_line(d.cli("meta", "set", "models/a", "format", "x", "--create", check=EXISTS))
    assert "metadata key 'format' exists on 'models/a'" in err
    assert d.cli("meta", "get", "models/a", "format", check=True).stdout == b"safetensors\n"
    d.cli("meta", "set", "models/a", "format", "gguf", "--replace", check=True)
    d.cli("ln", "-s", "a", "models/link", check=True)
    d.cli("meta", "set", "models/link", "via", "the link", check=True)   # followed
    d.cli("mkdir", "models/sub", check=True)
    d.cli("meta", "set", "models/sub", "team", "infra", check=True)
    assert d.cli_json("meta", "ls", "models")["metadata"] == {}
    assert d.cli_json("info", "models/sub")["metadata"] == {"team": "infra"}
    assert d.cli("info", "models", check=True).stdout.decode().count("metadata           -\n")
    assert d.cli_json("meta", "ls", "models/a")["metadata"] == {
        "format": "gguf", "index": '{"w": [0, 8]}\n', "via": "the link"}
    kinds = [(e["kind"], e["detail"]) for e in d.cli_json("events", "--path", "models/a")
             if e["kind"] == "meta"]
    assert kinds[0] == ("meta", {"action": "set", "key": "format", "bytes": 11})
    assert all("safetensors" not in json.dumps(detail) for _, detail in kinds)


def test_bytes_that_are_not_utf8_in_keys_and_values(daemon):
    key, value = os.fsdecode(b"\xff-key"), b"\xff\x00\x1b]0;x\x07\\n"
    with daemon.client() as c:
        made = c.create("a", 4096, metadata={key: value, "plain": ""})
        assert "metadata" not in made                   # info carries it, create does not
        assert c.info("a")["metadata"] == {"plain": "", key: os.fsdecode(value)}
        assert c.meta_get("a", key) == os.fsdecode(value)
        c.meta_set("a", "é", "\udcc3\udca9")             # the bytes of "é", escaped: one key
        assert c.meta("a")["é"] == "é"
    assert daemon.cli("meta", "get", "a", key, check=True).stdout == value + b"\n"
    listed = daemon.cli("meta", "ls", "a", check=True).stdout.decode()
    assert "\\xff-key=\\xff\\x00\\x1b]0;x\\x07\\\\n\n" in listed      # nothing raw on a terminal
    assert "\x1b" not in listed
    err = one_line(daemon.cli("meta", "set", "a", "k", "v", "--create", "--replace",
                              check=USAGE))
    assert "exclude each other" in err


def test_hard_links_share_it_and_the_last_name_takes_it(daemon):
    d = daemon
    d.cli("create", "a", "--size", "4096", "--durable", check=True)
    d.cli("ln", "a", "b", check=True)
    d.cli("meta", "set", "b", "k", "v", check=True)
    assert d.cli_json("meta", "ls", "a")["metadata"] == {"k": "v"}
    d.cli("rm", "a", check=True)
    assert d.cli_json("meta", "get", "b", "k")["value"] == "v"
    d.cli("rm", "b", check=True)
    d.cli("create", "b", "--size", "4096", check=True)      # a new node, nothing carried over
    assert d.cli_json("meta", "ls", "b")["metadata"] == {}


def test_metadata_survives_kill_9_and_restart(daemon):
    d = daemon
    with d.client() as c:
        c.create("keep", 4096, durable=True, metadata={"index": "x" * 10_000, "\udcff": ""})
        c.mkdir("dir")
        c.meta_set("dir", "team", "infra")
        c.create("gone", 4096, metadata={"k": "v"})        # transient: goes with the daemon
        c.meta_set("keep", "late", "set just before the kill")
    d.kill9()
    d.start()
    with d.client() as c:
        assert c.meta("keep") == {"index": "x" * 10_000, "late": "set just before the kill",
                                  "\udcff": ""}
        assert c.meta("dir") == {"team": "infra"}
        assert [e["path"] for e in c.ls()] == ["dir", "keep"]
        assert c.check()["clean"]


# ---- the bounds, and a second uid -------------------------------------------------------------
def bounded_daemon(daemon_factory, tmp_path):
    path = tmp_path / "gpumemd.toml"
    path.write_text('metadata_max_bytes = "2K"\nmetadata_user_max_bytes = "4K"\n')
    return daemon_factory(extra_args=["--config", str(path)])


def attempt(fn, *args, **kw) -> dict:
    try:
        return {"ok": fn(*args, **kw)}
    except GpumemError as exc:
        return {"code": exc.code, "message": str(exc)}


def _as_nobody(sock: str) -> dict:
    c = Client(sock)
    out = {
        "own": attempt(c.create, "nob", 4096, mode=0o644, metadata={"a": "v" * 1500}),
        "own2": attempt(c.create, "nob2", 4096, metadata={"a": "v" * 1500}),
        "own3": attempt(c.create, "nob3", 4096),
        "over": attempt(c.meta_set, "nob3", "b", "v" * 1100),      # 3002 + 1101 > 4096
        "over_create": attempt(c.create, "nob4", 4096, metadata={"a": "v" * 1500}),
        "set_roots_0644": attempt(c.meta_set, "open", "k", "mine"),
        "rm_roots_0644": attempt(c.meta_rm, "open", "k"),
        "get_roots_0644": attempt(c.meta_get, "open", "k"),
        "get_roots_0600": attempt(c.meta_get, "private", "k"),
        "ls_roots_0600": attempt(c.meta, "private"),
        "info_roots_0600": c.info("private")["metadata"],
        "on_the_root": attempt(c.meta_set, "", "k", "v"),
    }
    out["freed"] = attempt(c.meta_rm, "nob", "a")
    out["again"] = attempt(c.meta_set, "nob3", "b", "v" * 1100)
    out["made"] = [e["path"] for e in c.ls()]
    c.close()
    return out


@needs_root
def test_both_bounds_and_what_another_uid_may_do(daemon_factory, tmp_path):
    d = bounded_daemon(daemon_factory, tmp_path)
    with d.client() as c:
        c.create("open", 4096, mode=0o644, metadata={"k": "v"})
        c.create("private", 4096, mode=0o600, metadata={"k": "secret"})
    res = run_as(_as_nobody, d.socket)
    assert "ok" in res["own"] and "ok" in res["own2"] and "ok" in res["own3"]
    assert res["over"]["code"] == NO_MEMORY
    assert res["over"]["message"] == (
        "metadata quota exceeded for uid 65534: 4096 bytes (4K) of metadata allowed "
        "(metadata_user_max_bytes), 3002 used, 1101 more requested")
    assert res["over_create"]["code"] == NO_MEMORY
    assert "nob4" not in res["made"]                  # checked before anything was made
    for what in ("set_roots_0644", "rm_roots_0644", "get_roots_0600", "ls_roots_0600",
                 "on_the_root"):
        assert res[what]["code"] == PERMISSION, (what, res[what])
    assert res["get_roots_0644"] == {"ok": "v"}
    assert res["info_roots_0600"] is None            # stat-able, its metadata not readable
    assert "ok" in res["freed"] and "ok" in res["again"]    # the bytes came back to nobody
    assert d.cli_json("meta", "get", "open", "k")["value"] == "v"
    # Root is bound by the per-node bound (a property of the format) ...
    d.cli("create", "r", "--size", "4096", check=True)
    err = one_line(d.cli("meta", "set", "r", "k", "v" * 2048, check=USAGE))
    assert err == ("gpumemctl: error: metadata of 'r' would take 2049 bytes (keys and "
                   "values), more than the 2048 one allocation or directory may hold "
                   "(metadata_max_bytes)")
    # ... not by the per-user one: its own nodes hold more than 4K together.
    for name in ("r", "r2", "r3"):
        d.cli("create", name, "--size", "4096", "--exist-ok", check=True)
        d.cli("meta", "set", name, "k", "v" * 2000, check=True)
    # Root setting on nobody's allocation pays in the owner's name: exit 7 (nobody's
    # nodes hold 1501 + 1101 bytes now).
    err = one_line(d.cli("meta", "set", "nob", "big", "v" * 1500, check=NO_MEMORY))
    assert "metadata quota exceeded for uid 65534" in err
    d.cli("rm", "nob2", check=True)                  # the owner's bytes go with the node
    d.cli("meta", "set", "nob", "big", "v" * 1500, check=True)


@needs_root
def test_the_configuration_refuses_a_per_node_bound_past_896k(daemon_factory, tmp_path):
    path = tmp_path / "gpumemd.toml"
    path.write_text('metadata_max_bytes = "1M"\n')
    d = daemon_factory(start=False, extra_args=["--config", str(path)])
    d.spawn()
    assert d.proc.wait(30) == USAGE
    assert "bad value for 'metadata_max_bytes': '1M': expected at most 896K" in d.log()
