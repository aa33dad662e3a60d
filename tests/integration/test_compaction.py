"""Compaction of slabs (issue 26, docs/storage.md, "Compaction and fragmentation") against a
real daemon: `gpumemctl compact` gives fragmented slabs back, every object keeps its bytes
(read back, `check`, `verify --all`, and after a kill -9), a held object stays where it is,
only the administrator may compact, and housekeeping compacts by itself past the
configured slack."""
from __future__ import annotations

import json
import os

import pytest

import gpumemctl.cli.integrity  # the command's module, loaded before run_as drops root
import gpumemctl.formats  # noqa: F401 - loaded before run_as drops root
from tests.harness import wait_for
from tests.snapstore import cli_as
from tests.users import run_as

KiB, MiB = 1 << 10, 1 << 20
SIZE = 16 * KiB
PER_SLAB = (8 << 20) // SIZE        # the host backend's slabs are 8 MiB


def config_file(tmp_path, min_slack: str = "0") -> str:
    path = tmp_path / "gpumemd.toml"
    path.write_text(f'slabs = true\ncompact_min_slack = "{min_slack}"\n')
    return str(path)


@pytest.fixture
def packed(daemon_factory, tmp_path):
    return daemon_factory(extra_args=["--config", config_file(tmp_path),
                                      "--host-capacity", "512M"])


def blob(i: int) -> bytes:
    return i.to_bytes(4, "little") * (SIZE // 4)


def fragment(d, slabs: int = 4, durable: bool = True) -> list[str]:
    """`slabs` full slabs of 16 KiB objects, then three in four removed: every slab a
    quarter used. Returns the names left."""
    names = [f"kv/{i:05d}" for i in range(slabs * PER_SLAB)]
    with d.client() as c:
        c.create_many([(n, SIZE) for n in names], durable=durable, raise_errors=True)
        c.remove_many([n for i, n in enumerate(names) if i % 4], raise_errors=True)
        kept = names[::4]
        c.write_many([{"path": n, "data": blob(i * 4)} for i, n in enumerate(kept)],
                     raise_errors=True)
    wait_for(lambda: slab_use(d)["count"] == slabs, timeout=5, what="the slabs settle")
    return kept


def slab_use(d) -> dict:
    return d.cli_json("status")["devices"][0]["slabs"]


def free(d) -> int:
    return d.cli_json("status")["devices"][0]["free"]


def all_intact(d, kept: list[str]) -> None:
    with d.client() as c:
        got = c.read_many(kept, raise_errors=True)
    assert all(data == blob(i * 4) for i, data in enumerate(got))
    report = json.loads(d.cli("check", "--json", check=0).stdout)
    assert report["clean"], report["problems"]
    assert d.cli("verify", "--all", "--quiet", check=0).returncode == 0


def test_compact_gives_fragmented_slabs_back_and_keeps_every_byte(packed):
    d = packed
    kept = fragment(d)
    use = slab_use(d)
    assert use["fragmentation"] == 0.75 and use["slack_bytes"] == 4 * 6 * MiB
    shown = d.cli("status", check=True).stdout.decode()
    assert "slack 24M, fragmentation 75%" in shown
    metrics = d.cli("metrics", check=True).stdout.decode().splitlines()
    assert any(m.startswith("gpumemd_slab_slack_bytes{") and m.endswith(f" {24 * MiB}")
               for m in metrics)
    assert any(m.startswith("gpumemd_slab_fragmentation{") and m.endswith(" 0.75")
               for m in metrics)
    # An object held open (mapped where it lies: a region of its slab) stays there, and
    # its slab with it.
    with d.client() as c:
        held = c.open(kept[0], "r")
        raw, fds = c.call_fds("open", path=kept[0], mode="r", regions=True)
        before_free = free(d)
        dry = d.cli_json("compact", "--dry-run")
        # The held object's slab is kept, and the three others are emptied into it.
        assert dry["dry_run"] and dry["moved_count"] == 3 * PER_SLAB // 4
        assert len(dry["slabs_freed"]) == 3 and slab_use(d)["count"] == 4
        done = d.cli_json("compact")
        assert done["moved_count"] == dry["moved_count"]
        assert [(k["path"], k["reason"]) for k in done["skipped"]] == \
            [(kept[0], "held (open, attached, leased or open on the mount)")]
        assert [f["slab"] for f in done["slabs_freed"]] == \
            [f["slab"] for f in dry["slabs_freed"]]
        assert done["freed_bytes"] == 3 * (8 * MiB + done["slabs_freed"][0]["parity_bytes"])
        assert kept[0] not in {m["path"] for m in done["moved"]}
        assert free(d) - before_free == done["freed_bytes"]
        assert slab_use(d)["count"] == 1 and slab_use(d)["fragmentation"] == 0.0
        assert held.read() == blob(0)            # the mapping of its slab, unchanged
        again, more = c.call_fds("open", path=kept[0], mode="r", regions=True)
        assert again["info"]["region"] == raw["info"]["region"]
        assert os.fstat(more[0]).st_ino == os.fstat(fds[0]).st_ino     # the same slab
        for answer, fd in ((again, more[0]), (raw, fds[0])):
            os.close(fd)
            c.call("close", handle=answer["handle"], written=None)
        held.close()
    all_intact(d, kept)
    text = d.cli("compact", check=True).stdout.decode().splitlines()
    assert text == ["compact: moved 0 allocations (0B), 0 slabs, 0B given back"]
    out = d.cli("compact", "--dry-run", check=True).stdout.decode()
    assert out.endswith("would be given back\n")
    d.kill9()
    d.start()
    all_intact(d, kept)


def test_a_kill_right_after_a_pass_loses_nothing(packed):
    d = packed
    kept = fragment(d, slabs=3)
    done = d.cli_json("compact")
    assert done["moved_count"] == 2 * PER_SLAB // 4
    d.kill9()
    d.start()
    assert slab_use(d)["count"] == 1
    all_intact(d, kept)


def test_an_attached_object_is_not_moved(packed):
    d = packed
    kept = fragment(d, slabs=2)
    with d.client() as c:
        result, fds = c.call_fds("attach", path=kept[0], mode="r", regions=True)
        region = result["info"]["region"]
        done = d.cli_json("compact")
        # kept[0]'s slab cannot be emptied: the other one is, into it.
        assert done["moved_count"] == PER_SLAB // 4 and kept[0] not in \
            {m["path"] for m in done["moved"]}
        assert c.call("info", path=kept[0]) is not None
        again, more = c.call_fds("attach", path=kept[0], mode="r", regions=True)
        assert again["info"]["region"] == region
        assert os.fstat(more[0]).st_ino == os.fstat(fds[0]).st_ino
        for fd in fds + more:
            os.close(fd)
        c.call("detach", handle=again["handle"])
        c.call("detach", handle=result["handle"])
    all_intact(d, kept)


def test_only_the_administrator_compacts(packed):
    d = packed
    kept = fragment(d, slabs=2)
    before = slab_use(d)
    out = run_as(cli_as, d.socket, "compact", uid=1000, gid=1000)
    assert out["code"] == 6, out
    assert "permission denied" in out["stderr"] and "Traceback" not in out["stderr"]
    assert len(out["stderr"].strip().splitlines()) == 1
    out = run_as(cli_as, d.socket, "compact", "--dry-run", "--json", uid=1000, gid=1000)
    assert out["code"] == 6, out
    assert slab_use(d) == before
    all_intact(d, kept)


def test_housekeeping_compacts_past_the_configured_slack(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--config", config_file(tmp_path, "4M"),
                                   "--host-capacity", "512M"])
    kept = fragment(d, slabs=3, durable=False)      # 18 MiB of slack, 75% of 24 MiB
    wait_for(lambda: slab_use(d)["count"] == 1, timeout=20, what="housekeeping compacts")
    all_intact(d, kept)
