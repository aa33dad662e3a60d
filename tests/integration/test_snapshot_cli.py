"""Snapshots as a new user meets them (issue 27, item 7): `snapshot ls` of one snapshot lists
what it holds, a restore gives back each allocation's modification time, byte ranges read
the same in `snapshot verify`, `snapshot restore` and `info`, and summaries go to stderr
(stdout carries data only: a listing, a JSON document, a file). Each test looks only at what
a user sees: exit codes, stdout and stderr, bytes, `info`.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests.sizes import MiB
from tests.snapstore import (
    fill,
    lose_memory,
    make_store,
    one_line_error,
    read_manifest,
    write_manifest,
)

UNCORRECTABLE = 8
SNAP_RE = re.compile(r"snap-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6}")


def _snapshots(store: str) -> list[str]:
    return sorted(n for n in os.listdir(store) if SNAP_RE.fullmatch(n))


# ---- 1. `snapshot ls STORE/snap-...` lists the allocations it holds -----------------------
def test_ls_of_one_snapshot_lists_its_allocations(daemon, request):
    store = make_store(request)
    fill(daemon, {"models/w": 3 * MiB + 5, "kv": 10})
    first = {p: daemon.cli_json("info", p)["modified"] for p in ("models/w", "kv")}
    full = daemon.cli_json("snapshot", "create", store)["snapshot"]
    with daemon.client() as c:
        c.write("models/w", b"x", offset=2 * MiB)
    now = {p: daemon.cli_json("info", p)["modified"] for p in ("models/w", "kv")}
    inc = daemon.cli_json("snapshot", "create", store, "--incremental")["snapshot"]

    rows = daemon.cli_json("snapshot", "ls", os.path.join(store, inc))
    got = {r["path"]: r for r in rows}
    assert len(rows) == 2 and {p: (r["size"], r["blocks"], r["state"], r["modified"])
                               for p, r in got.items()} == \
        {"models/w": (3 * MiB + 5, 4, "ok", now["models/w"]), "kv": (10, 1, "ok", now["kv"])}
    assert got["models/w"]["blocks_here"] == 1 and got["kv"]["blocks_here"] == 0, rows
    assert got["models/w"]["mode"] == "0600" and got["kv"]["durable"] is True

    shown = daemon.cli("snapshot", "ls", os.path.join(store, full), check=True)
    assert shown.stderr == b"", shown.stderr
    lines = shown.stdout.decode().splitlines()
    assert lines[0].split() == ["PATH", "SIZE", "BLOCKS", "STATE", "MODIFIED", "(UTC)"]
    table = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert table == {"models/w": ["3M", "4", "ok", first["models/w"]],
                     "kv": ["10B", "1", "ok", first["kv"]]}, lines

    # The store itself is still listed as snapshots, one row each.
    assert [r["snapshot"] for r in daemon.cli_json("snapshot", "ls", store)] == [full, inc]


def test_ls_of_a_partial_or_damaged_snapshot_says_so(daemon, request):
    store = make_store(request)
    fill(daemon, {"a": 4096})
    name = daemon.cli_json("snapshot", "create", store)["snapshot"]
    partial = "snap-20200101T000000.000000Z-aaaaaa"
    os.makedirs(os.path.join(store, partial, "data"), mode=0o700)
    gone = daemon.cli("snapshot", "ls", os.path.join(store, partial), check=4)
    assert gone.stdout == b"" and "partial" in one_line_error(gone.stderr)[0], gone.stderr
    missing = daemon.cli("snapshot", "ls", os.path.join(store, "snap-20200101T000000.000000Z-"
                                                                "bbbbbb"), check=4)
    assert missing.stdout == b"", missing.stdout
    path = os.path.join(store, name, "manifest.json")
    with open(path, "r+b") as f:
        raw = f.read()
        f.seek(raw.index(b'"path"'))
        f.write(b'"Path"')
    damaged = daemon.cli("snapshot", "ls", os.path.join(store, name), check=UNCORRECTABLE)
    assert damaged.stdout == b"" and "checksum" in one_line_error(damaged.stderr)[0]


# ---- 2. a restore keeps each allocation's modification time -------------------------------
def test_restore_gives_back_the_modification_time(daemon, request):
    store = make_store(request)
    fill(daemon, {"old": 2 * MiB + 1, "dir/new": 4096})
    before = {p: daemon.cli_json("info", p)["modified"] for p in ("old", "dir/new")}
    daemon.cli("snapshot", "create", store, "--quiet", check=True)
    time.sleep(0.05)                    # a time taken now differs from the one kept
    lose_memory(daemon)
    daemon.cli("snapshot", "restore", store, "--quiet", check=True)    # lost ones refilled
    daemon.cli("snapshot", "restore", store, "--as", "copy", "--quiet", check=True)  # new
    for path, when in before.items():
        assert daemon.cli_json("info", path)["modified"] == when, path
        assert daemon.cli_json("info", f"copy/{path}")["modified"] == when, path


@pytest.mark.parametrize("bad", [-5, 10**30, 1.5, "yesterday", "1969-12-31T23:59:59.000000Z",
                                 "9999-12-31T23:59:59.999999Z", "2026-02-30T00:00:00.000000Z",
                                 ["2026"], "x" * 100_000],
                         ids=["negative", "huge", "float", "words", "before-1970",
                              "past-2262", "february-30", "list", "100k-string"])
def test_an_absurd_modification_time_in_a_manifest_is_named_not_a_crash(daemon, request, bad):
    store = make_store(request)
    fill(daemon, {"a": 4096})
    name = daemon.cli_json("snapshot", "create", store)["snapshot"]
    manifest = read_manifest(store, name)
    manifest["allocations"][0]["modified"] = bad
    write_manifest(store, manifest)                       # sealed: only the field is wrong
    where = os.path.join(store, name)
    before = daemon.cli_json("ls", "-R")
    refused = daemon.cli("snapshot", "restore", where, "--as", "copy", check=UNCORRECTABLE)
    [line] = one_line_error(refused.stderr)
    assert "allocation 0 modified" in line and len(line) < 400, line
    assert daemon.cli_json("ls", "-R") == before           # nothing made
    listed = daemon.cli("snapshot", "ls", where, check=UNCORRECTABLE)
    assert "allocation 0 modified" in one_line_error(listed.stderr)[0]
    rows = daemon.cli_json("snapshot", "ls", store)
    assert rows[0]["state"] == "damaged" and "modified" in rows[0]["message"], rows


# ---- 3. byte ranges: first and last byte, everywhere a person reads them ------------------
def test_byte_ranges_read_the_same_in_verify_restore_and_info(daemon, request):
    daemon.allow_errors = True           # damage beyond repair is logged at ERROR, on purpose
    store = make_store(request)
    fill(daemon, {"w": 3 * MiB})
    name = daemon.cli_json("snapshot", "create", store)["snapshot"]
    entry = read_manifest(store, name)["allocations"][0]
    [[_first, _count, key, offset]] = entry["extents"]
    with open(os.path.join(store, key), "r+b") as f:      # a byte of block 1 flipped
        f.seek(offset + MiB + 7)
        byte = f.read(1)
        f.seek(offset + MiB + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    shown = f"{MiB}-{2 * MiB - 1}"                       # first and last byte

    verified = daemon.cli("snapshot", "verify", store, check=UNCORRECTABLE)
    assert f"(bytes {shown})" in verified.stdout.decode(), verified.stdout
    restored = daemon.cli("snapshot", "restore", store, "--as", "copy", check=UNCORRECTABLE)
    assert f"checksum at {shown};" in restored.stderr.decode(), restored.stderr
    info = daemon.cli("info", "copy/w", check=True).stdout.decode()
    assert re.search(rf"^damaged +{shown}$", info, re.MULTILINE), info
    # JSON keeps the half-open pairs.
    assert daemon.cli_json("info", "copy/w")["damaged"] == [[MiB, 2 * MiB]]
    back = json.loads(daemon.cli("snapshot", "verify", store, "--json",
                                 check=UNCORRECTABLE).stdout)
    assert back["snapshots"][0]["problems"][0]["ranges"] == [[MiB, 2 * MiB]]


# ---- 4. summaries on stderr, data on stdout ------------------------------------------------
def test_snapshot_summaries_go_to_stderr_and_json_alone_to_stdout(daemon, request):
    store = make_store(request)
    fill(daemon, {"a": MiB + 3})
    made = daemon.cli("snapshot", "create", store, check=True)
    assert made.stdout == b"", made.stdout
    assert re.search(rb"^snapshot .*snap-.*: 1 allocation\(s\)", made.stderr, re.M), made.stderr
    verified = daemon.cli("snapshot", "verify", store, check=True)
    assert verified.stdout == b"", verified.stdout
    assert b"1 snapshot(s), 0 damaged" in verified.stderr, verified.stderr
    restored = daemon.cli("snapshot", "restore", store, "--as", "r", check=True)
    assert restored.stdout == b"", restored.stdout
    assert b"1 of 1 allocation(s) restored" in restored.stderr, restored.stderr
    quiet = daemon.cli("snapshot", "create", store, "--quiet", check=True)
    assert (quiet.stdout, quiet.stderr) == (b"", b"")

    for args in (("create", store), ("verify", store), ("restore", store, "--as", "j"),
                 ("ls", store), ("ls", os.path.join(store, _snapshots(store)[0]))):
        proc = daemon.cli("snapshot", *args, "--json", check=True)
        json.loads(proc.stdout)                           # one JSON document, nothing else
        assert proc.stderr == b"", (args, proc.stderr)


def test_load_and_save_summaries_go_to_stderr(daemon, tmp_path):
    np = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    src = str(tmp_path / "w.safetensors")
    safetensors_numpy.save_file({"w": np.arange(64, dtype=np.float32)}, src)
    loaded = daemon.cli("load", src, "w", check=True)
    assert loaded.stdout == b"", loaded.stdout
    assert loaded.stderr.decode().startswith("loaded 1 tensors ("), loaded.stderr
    out = str(tmp_path / "back.safetensors")
    saved = daemon.cli("save", "w", out, check=True)
    assert saved.stdout == b"", saved.stdout
    assert saved.stderr.decode().startswith(f"saved w to {out} ("), saved.stderr
    to_stdout = daemon.cli("save", "w", "-", check=True)
    with open(src, "rb") as f:
        assert to_stdout.stdout == f.read()                 # the file, and nothing else
    assert to_stdout.stderr.decode().startswith("saved w to stdout ("), to_stdout.stderr
    as_json = daemon.cli("load", src, "w2", "--json", check=True)
    assert json.loads(as_json.stdout)["name"] == "w2" and as_json.stderr == b""
