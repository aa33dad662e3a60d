"""Snapshots in S3-compatible object storage, end to end: the CLI against a local S3 server
(moto's server mode, started by the test) and a real daemon whose memory is lost as after a
reboot."""
from __future__ import annotations

import json
import os

from tests.integration.s3server import moto_s3

MiB = 1 << 20


def _fill(daemon, sizes: dict[str, int]) -> dict[str, bytes]:
    data = {}
    with daemon.client() as c:
        for name, size in sizes.items():
            c.create(name, size, durable=True, mode=0o640)
            data[name] = os.urandom(size)
            c.write(name, data[name])
    return data


def test_a_snapshot_in_s3_brings_lost_memory_back(daemon):
    """create to s3://, lose the memory (stop, kill the keeper, start), restore from s3://:
    every byte back, `ready`, check clean; an incremental snapshot there writes only the
    changed block, verify is clean, and `rm --keep 1` keeps what the newest one uses."""
    data = _fill(daemon, {"models/w": 9 * MiB + 7, "kv": 3 * MiB, "tiny": 10})
    with moto_s3() as s3:
        env = s3["env"]
        where = f"s3://{s3['bucket']}/fleet/node1"
        made = json.loads(daemon.cli("snapshot", "create", where, "--json", env=env,
                                     check=True).stdout)
        assert made["io"] == "s3" and made["bytes"] == sum(map(len, data.values()))
        assert made["location"].startswith(where + "/snap-")

        daemon.stop()
        daemon.kill_keeper()
        daemon.start()
        with daemon.client() as c:
            assert {c.info(n)["state"] for n in data} == {"lost"}
        back = json.loads(daemon.cli("snapshot", "restore", where, "--json", env=env,
                                     check=True).stdout)
        assert [a["result"] for a in back["allocations"]] == ["ok"] * 3
        with daemon.client() as c:
            for name, expected in data.items():
                assert c.read(name) == expected, name
                assert c.info(name)["state"] == "ready"
            assert c.check()["clean"]
            c.write("models/w", b"changed", offset=5 * MiB)
        data["models/w"] = data["models/w"][:5 * MiB] + b"changed" + \
            data["models/w"][5 * MiB + 7:]

        inc = json.loads(daemon.cli("snapshot", "create", where, "--incremental", "--json",
                                    env=env, check=True).stdout)
        assert inc["incremental"] and inc["bytes_written"] == MiB
        daemon.cli("snapshot", "verify", where, env=env, check=True)
        daemon.cli("snapshot", "rm", where, "--keep", "1", env=env, check=True)
        daemon.cli("snapshot", "restore", where, "models/w", "--as", "copy", env=env,
                   check=True)
        with daemon.client() as c:
            assert c.read("copy/models/w") == data["models/w"]
        listed = json.loads(daemon.cli("snapshot", "ls", where, "--json", env=env,
                                       check=True).stdout)
        assert [r["state"] for r in listed] == ["retired", "complete"]


def test_an_unknown_bucket_is_one_line_and_exit_4(daemon):
    _fill(daemon, {"a": 4096})
    with moto_s3() as s3:
        proc = daemon.cli("snapshot", "create", "s3://no-such-bucket/x", env=s3["env"])
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "no-such-bucket" in lines[0]
