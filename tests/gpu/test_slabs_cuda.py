"""Slabs on a real GPU (issue 26, config `slabs = true`): small allocations packed in slabs
that are cuMemCreate allocations, written and read by copy (write_many, read_many), mapped in
place by their owner (attach: the slab whole, the pointer plus the slot's offset), verified
by the CUDA codec over the slab's parity, and adopted again after a kill -9."""
from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu

KiB, MiB = 1 << 10, 1 << 20
N, SIZE = 2000, 64 * KiB


def test_packed_objects_on_a_gpu(daemon_factory, tmp_path):
    conf = tmp_path / "gpumemd.toml"
    conf.write_text("slabs = true\n")
    d = daemon_factory(backend="cuda", extra_args=["--config", str(conf)])
    names = [f"kv/{i:05d}" for i in range(N)]
    blobs = {n: os.urandom(SIZE) for n in names[::7]}
    with d.client() as c:
        before = sum(dev["ours"] for dev in c.status()["devices"])
        made = c.create_many([{"path": n, "size": SIZE, "durable": True} for n in names],
                             raise_errors=True)
        assert len(made) == N
        c.write_many([{"path": n, "offset": 0, "data": b} for n, b in blobs.items()],
                     raise_errors=True)
        held = sum(dev["ours"] for dev in c.status()["devices"]) - before
        got = c.read_many([{"path": n, "offset": 0, "length": SIZE} for n in blobs],
                          raise_errors=True)
        assert all(r == blobs[n] for n, r in zip(blobs, got, strict=True))
        name, data = next(iter(blobs.items()))
        with c.attach(name, "r") as a:                 # in place: a region of the slab
            assert a.read(0, SIZE) == data
        with c.open(name, "rw") as h:
            h.write(b"\x01" * 4096, 8192)
        assert c.info(name)["capacity"] == SIZE        # still packed
    blobs[name] = data[:8192] + b"\x01" * 4096 + data[8192 + 4096:]
    stored = N * SIZE
    print(json.dumps({"objects": N, "stored": stored, "held": held,
                      "ratio": round(held / stored, 3)}))
    assert held <= 1.5 * stored, (held, stored)
    assert d.cli("verify", "--all", check=0).returncode == 0
    d.kill9()
    d.start()
    with d.client() as c:
        got = c.read_many([{"path": n, "offset": 0, "length": SIZE} for n in blobs],
                          raise_errors=True)
        assert all(r == blobs[n] for n, r in zip(blobs, got, strict=True))
        assert {i["state"] for i in c.ls("kv")} == {"ready"}
    assert json.loads(d.cli("check", "--json", check=0).stdout)["clean"]
    assert d.cli("verify", "--all", check=0).returncode == 0
