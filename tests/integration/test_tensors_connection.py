"""gpumemctl.tensors.load of a sharded model through one connection (issue 29): every shard is
attached in the session that listed them, and each shard's attachment still goes when the
last tensor of that shard is freed, the connection with the last of them (docs/tensors.md).
Host backend, numpy, a real gpumemd."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from safetensors.numpy import save_file

import gpumemctl.tensors
from gpumemctl.attach import attach
from gpumemctl.protocol import Busy
from tests.harness import wait_for

SHARDS = {
    "model-00001-of-00003.safetensors": {"a": np.arange(64, dtype=np.float32)},
    "model-00002-of-00003.safetensors": {"b": np.arange(100, 132, dtype=np.int64)},
    "model-00003-of-00003.safetensors": {"c": np.full((4, 4), 7, dtype=np.float16)},
}


def holders(daemon, path: str) -> list[dict]:
    with daemon.client() as c:
        return c.info(path)["holders"]


def test_every_shard_is_attached_in_one_session_and_freed_shard_by_shard(daemon, tmp_path):
    for file, tensors in SHARDS.items():
        save_file(tensors, str(tmp_path / file))
    daemon.cli("load", str(tmp_path), "m", check=True)
    paths = [f"m/{f}" for f in SHARDS]

    weights = gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket)
    held = [holders(daemon, p) for p in paths]
    assert [[h["kind"] for h in hs] for hs in held] == [["attach-r"]] * 3
    assert len({hs[0]["session"] for hs in held}) == 1, held      # one connection
    a, b, c = weights["a"], weights["b"], weights["c"]
    del weights
    gc.collect()

    del a                                   # the first shard's last tensor
    gc.collect()
    wait_for(lambda: holders(daemon, paths[0]) == [], what="the first shard's attachment")
    assert [h["kind"] for h in holders(daemon, paths[1])] == ["attach-r"]
    assert b.tolist() == list(range(100, 132)) and (c == 7).all()   # the others still read

    del b, c
    gc.collect()
    wait_for(lambda: all(holders(daemon, p) == [] for p in paths), what="every attachment")
    daemon.cli("rm", "-r", "m", check=True)                         # nothing holds it


def test_a_shard_that_cannot_be_attached_leaves_no_attachment(daemon, tmp_path):
    for file, tensors in SHARDS.items():
        save_file(tensors, str(tmp_path / file))
    daemon.cli("load", str(tmp_path), "m", check=True)
    paths = [f"m/{f}" for f in SHARDS]
    with daemon.client() as writer:
        # Another session writes the last shard: the load's read attach of it is busy.
        held = attach(paths[2], "rw", client=writer)
        try:
            with pytest.raises(Busy):
                gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket)
            for p in paths[:2]:          # what it had attached before is let go
                wait_for(lambda p=p: holders(daemon, p) == [],
                         what="the shards attached before the failure to be detached")
        finally:
            held.detach()
