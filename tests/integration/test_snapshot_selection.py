"""Which snapshots `snapshot rm --keep N` keeps and `snapshot restore STORE` reads (issue 24,
items 15 and 16): never fewer than min(N, count) complete snapshots nor data a kept one
needs, each allocation from the newest complete snapshot that holds it, and a failed
restore that names each allocation once and counts only what it moved."""
from __future__ import annotations

import json
import os
import tempfile

import xxhash  # noqa: F401 - block checksums
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumemctl.snapshots import engine
from gpumemctl.snapshots import manifest as fmt
from tests.snapstore import MiB, fill, lose_memory, make_store, states, write_manifest

EXISTS = 5


# ---- item 15: rm --keep N, a property over stores -------------------------------------------
def _own_entry(store: str, name: str, index: int, payload: bytes) -> dict:
    """An allocation of one block whose data is this snapshot's own object."""
    key = fmt.data_key(name, index)
    os.makedirs(os.path.join(store, name, "data"), mode=0o700, exist_ok=True)
    with open(os.path.join(store, key), "wb") as f:
        f.write(payload)
    return {"path": f"a{index}", "names": [], "id": index, "size": len(payload),
            "capacity": 4096, "mode": 0o600, "uid": 0, "gid": 0, "durable": True,
            "ecc": "rs", "device": None, "unsealed": False, "modified": None, "metadata": {},
            "track": None, "blocks": [fmt.block_hash(payload)],
            "extents": [[0, 1, key, 0]]}


def _build(store: str, plan: list[tuple[str, int | None]]) -> list[str]:
    """Snapshots in age order: ("complete", parent index or None) holds its own allocation
    and every allocation of its parent (referring to the parent's objects, as an
    incremental snapshot does); ("partial", _) has data and no manifest."""
    names, held = [], {}
    for i, (kind, parent) in enumerate(plan):
        name = fmt.new_name(1_800_000_000_000_000_000 + i * 1000)
        names.append(name)
        entry = _own_entry(store, name, i, os.urandom(64 + i))
        if kind == "partial":
            continue
        allocations = [entry]
        if parent is not None and names[parent] in held:
            allocations += held[names[parent]]
        held[name] = allocations
        write_manifest(store, {
            "format": fmt.FORMAT, "version": fmt.VERSION, "name": name, "created_ns": i,
            "host": "here", "uid": 0, "backend": "host", "block_size": fmt.BLOCK,
            "hash": fmt.HASH,
            "parent": names[parent] if parent is not None and names[parent] in held else None,
            "allocations": allocations, "bytes": sum(a["size"] for a in allocations),
            "bytes_written": entry["size"]})
    return names


def _complete(store: str) -> list[str]:
    return [r["snapshot"] for r in engine.list_snapshots(store) if r["state"] == "complete"]


def _parents(i: int):
    """None, or the index of an older snapshot to build on."""
    return st.none() | st.integers(0, i - 1) if i else st.none()


plans = st.integers(0, 6).flatmap(lambda n: st.tuples(*[
    st.tuples(st.sampled_from(["complete", "complete", "partial"]), _parents(i))
    for i in range(n)]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans, keeps=st.lists(st.integers(0, 8), min_size=1, max_size=2))
def test_rm_keep_never_leaves_fewer_than_asked_nor_data_a_kept_one_needs(plan, keeps):
    """Over stores of up to 6 snapshots (complete ones building on older ones, partial ones)
    and one or two `rm --keep N` in a row: the newest min(N, count) complete snapshots are
    still there and complete, every one of them verifies (each block of each allocation,
    its parents' objects included), and no partial one is left."""
    with tempfile.TemporaryDirectory(prefix="gpumem-snapstore-") as store:
        _build(store, list(plan))
        for keep in keeps:
            before = _complete(store)
            engine.remove(store, keep)
            after = _complete(store)
            assert after == before[max(0, len(before) - keep):] if keep else after == [], \
                (before, keep, after)
            report = engine.verify(store)
            assert report["damaged"] == 0, report
            assert {r["result"] for r in report["snapshots"]} <= {"ok", "retired"}, report


# ---- item 16: each allocation from the newest snapshot that holds it ---------------------------
def test_restore_takes_each_allocation_from_the_newest_snapshot_that_holds_it(daemon,
                                                                               request):
    """A full snapshot of A and B, then an incremental one of A alone: after the memory is
    lost, a plain `restore STORE` brings both back (A from the incremental one, B from the
    full one), and so does `--lost-only` (what restore_on_start runs)."""
    store = make_store(request)
    data = fill(daemon, {"A": 2 * MiB + 3, "B": MiB + 7})
    full = daemon.cli_json("snapshot", "create", store)["snapshot"]
    with daemon.client() as c:
        c.write("A", b"changed", MiB)
    data["A"] = data["A"][:MiB] + b"changed" + data["A"][MiB + 7:]
    inc = daemon.cli_json("snapshot", "create", "--incremental", store, "A")
    assert inc["parent"] == full and [a["path"] for a in inc["allocations"]] == ["A"]

    for how in ([], ["--lost-only"]):
        lose_memory(daemon)
        assert states(daemon) == {"A": "lost", "B": "lost"}
        back = json.loads(daemon.cli("snapshot", "restore", store, *how, "--json",
                                     check=True).stdout)
        assert states(daemon) == {"A": "ready", "B": "ready"}, (how, back)
        with daemon.client() as c:
            for path, blob in data.items():
                assert c.read(path) == blob, (how, path)
        assert {a["path"]: (a["result"], a["snapshot"]) for a in back["allocations"]} == \
            {"A": ("ok", inc["snapshot"]), "B": ("ok", full)}, back
        assert back["bytes"] == len(data["A"]) + len(data["B"])


def test_a_failed_restore_names_each_allocation_once_and_counts_only_what_moved(daemon,
                                                                                 request):
    """Restoring over allocations that exist: each is refused (exit 5) in one line that
    names it once, and the summary counts nothing moved: no size restored, no rate."""
    store = make_store(request)
    fill(daemon, {"x": 3 * MiB, "y": MiB})
    daemon.cli("snapshot", "create", store, "--quiet", check=True)
    proc = daemon.cli("snapshot", "restore", store, check=EXISTS)
    *errors, summary = proc.stderr.decode().splitlines()     # the summary last, on stderr
    assert len(errors) == 2 and proc.stdout == b"", (errors, proc.stdout)
    for path, line in zip(("x", "y"), errors, strict=True):
        assert line.count(f"'{path}'") == 1 and "exists (state ready)" in line, line
    assert summary.endswith("0 of 2 allocation(s) restored, nothing moved: 0 degraded, "
                            "2 failed"), summary
    counted = summary.split(": ", 1)[1]                 # after the location
    assert "/s" not in counted and "4M" not in counted, summary
