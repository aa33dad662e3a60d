"""`gpumemctl load` / `save` and gpumemctl.tensors on the host backend (numpy), against a real
gpumemd: what a file reads back as, what is left after bad input, and how long the memory
stays attached (docs/tensors.md). The GPU side (torch, cupy) is tests/gpu/test_tensors_cuda.py.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import struct
import subprocess
import textwrap

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import gpumemctl.tensors
from gpumemctl.protocol import NotFound, UsageError
from tests.harness import PYTHON, ROOT, child_env, script_argv, wait_for


def mixed_tensors() -> dict[str, np.ndarray]:
    """Several dtypes (bf16 through ml_dtypes, as the library itself holds it) and shapes:
    a scalar, empty tensors, odd sizes."""
    rng = np.random.default_rng(17)
    return {
        "embed.weight": rng.standard_normal((33, 16)).astype(np.float16),
        "layers.0.attn.weight": rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16),
        "layers.0.mlp.weight": rng.standard_normal((16, 48)).astype(np.float32),
        "layers.0.mlp.bias": rng.standard_normal(48).astype(np.float32),
        "positions": np.arange(-5, 95, dtype=np.int64),
        "mask": rng.integers(0, 2, 13).astype(bool),
        "bytes": rng.integers(0, 256, 7).astype(np.uint8),
        "scale": np.array(0.125, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "empty_bf16": np.zeros((3, 0), dtype=ml_dtypes.bfloat16),
    }


@pytest.fixture
def model_file(tmp_path):
    path = str(tmp_path / "model.safetensors")
    save_file(mixed_tensors(), path, metadata={"format": "np", "note": "test"})
    return path


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape, k
        assert got[k].tobytes() == v.tobytes(), k


def holders(daemon, name: str) -> list[str]:
    with daemon.client() as c:
        return [h["kind"] for h in c.info(name)["holders"]]


def tree(daemon) -> list[str]:
    return sorted(e["path"] for e in daemon.cli_json("ls", "-R"))


# ---- one file ---------------------------------------------------------------------------------
def test_load_reads_back_equal_and_saves_byte_identically(daemon, model_file, tmp_path):
    out = daemon.cli_json("load", model_file, "models/m")
    assert (out["name"], out["tensors"]) == ("models/m", 10)
    assert out["bytes"] == os.path.getsize(model_file) - 8 - struct.unpack(
        "<Q", open(model_file, "rb").read(8))[0]
    info = daemon.cli_json("info", "models/m")
    assert info["size"] == out["bytes"] and info["state"] == "ready"
    header = json.loads(info["metadata"]["safetensors"])
    assert header["__metadata__"] == {"format": "np", "note": "test"}
    assert header["scale"]["shape"] == []

    weights = gpumemctl.tensors.load("models/m", framework="numpy", socket=daemon.socket)
    assert_same(weights, load_file(model_file))
    assert weights.index.metadata == {"format": "np", "note": "test"}
    del weights

    saved = str(tmp_path / "saved.safetensors")
    result = daemon.cli_json("save", "models/m", saved)
    assert result["bytes"] == out["bytes"]
    assert open(saved, "rb").read() == open(model_file, "rb").read()
    with safe_open(saved, framework="numpy") as st:          # the library's own reader
        assert len(st.keys()) == 10
    assert_same(load_file(saved), load_file(model_file))


def test_index_without_mapping_and_human_output(daemon, model_file):
    done = daemon.cli("load", model_file, "m", check=True)
    assert done.stdout == b""                    # stdout carries data only (issue 27)
    assert done.stderr.decode().startswith("loaded 10 tensors (")
    assert "None" not in done.stderr.decode()
    index = gpumemctl.tensors.open("m", socket=daemon.socket)
    t = index["layers.0.mlp.weight"]
    assert (t.dtype, t.shape, t.nbytes, t.shard) == ("F32", (16, 48), 16 * 48 * 4, "m")
    assert holders(daemon, "m") == []                         # nothing attached
    assert "safetensors" in daemon.cli("info", "m", check=True).stdout.decode()


def test_a_changed_allocation_saves_its_new_bytes(daemon, model_file, tmp_path):
    daemon.cli("load", model_file, "m", check=True)
    weights = gpumemctl.tensors.load("m", framework="numpy", mode="rw", socket=daemon.socket)
    weights["layers.0.mlp.bias"][:] = 7.0
    with daemon.client() as c:
        assert c.info("m")["unsealed"] is True and holders(daemon, "m") == ["attach-w"]
    weights.seal()
    with daemon.client() as c:
        assert c.info("m")["unsealed"] is False and holders(daemon, "m") == ["attach-w"]
    del weights
    gc.collect()
    wait_for(lambda: holders(daemon, "m") == [], what="the writer's attachment to go")
    daemon.cli("save", "m", str(tmp_path / "new.safetensors"), check=True)
    new = load_file(str(tmp_path / "new.safetensors"))
    assert (new["layers.0.mlp.bias"] == 7.0).all()
    want = load_file(model_file)
    assert new["embed.weight"].tobytes() == want["embed.weight"].tobytes()


# ---- lifetime -----------------------------------------------------------------------------------
def test_the_attachment_lives_as_long_as_any_tensor(daemon, model_file):
    daemon.cli("load", model_file, "m", check=True)
    weights = gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket)
    kept = weights["positions"]
    assert holders(daemon, "m") == ["attach-r"]
    del weights
    gc.collect()
    assert holders(daemon, "m") == ["attach-r"]               # one tensor still holds it
    assert kept.tolist() == list(range(-5, 95))               # and it still reads
    with pytest.raises(ValueError):
        kept[0] = 1                                           # read-only mapping
    del kept
    gc.collect()
    wait_for(lambda: holders(daemon, "m") == [], what="the attachment to go")
    daemon.cli("rm", "m", check=True)                         # nothing holds it


def test_a_killed_writer_leaves_it_unsealed_and_its_bytes_kept(daemon, model_file):
    daemon.cli("load", model_file, "m", "--durable", check=True)
    code = textwrap.dedent("""
        import os, signal, sys, gpumemctl.tensors
        w = gpumemctl.tensors.load("m", framework="numpy", mode="rw", socket=sys.argv[1])
        w["positions"][:] = 42
        print("written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([PYTHON, "-c", code, daemon.socket], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "written\n", proc.stderr
    wait_for(lambda: holders(daemon, "m") == [], what="the dead writer's session to end")
    assert daemon.cli_json("info", "m")["unsealed"] is True
    weights = gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket)
    assert (weights["positions"] == 42).all()
    assert weights["embed.weight"].tobytes() == load_file(model_file)["embed.weight"].tobytes()


def test_durable_weights_survive_a_daemon_crash(daemon, model_file):
    daemon.cli("load", model_file, "m", "--durable", check=True)
    daemon.kill9()
    daemon.start()
    assert_same(gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket),
                load_file(model_file))


# ---- sharded models ---------------------------------------------------------------------------
def write_sharded(directory, with_index: bool = True) -> dict[str, np.ndarray]:
    tensors = mixed_tensors()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:5],
              "model-00002-of-00002.safetensors": names[5:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(directory / file))
    if with_index:
        index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values())},
                 "weight_map": {k: f for f, keys in shards.items() for k in keys}}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return tensors


def test_a_sharded_model_loads_as_a_directory_and_saves_back(daemon, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    tensors = write_sharded(src)
    out = daemon.cli_json("load", str(src / "model.safetensors.index.json"), "llm")
    assert out["tensors"] == 10 and len(out["allocations"]) == 2
    assert tree(daemon) == ["llm", "llm/model-00001-of-00002.safetensors",
                            "llm/model-00002-of-00002.safetensors"]
    assert_same(gpumemctl.tensors.load("llm", framework="numpy", socket=daemon.socket),
                tensors)
    assert gpumemctl.tensors.open("llm", socket=daemon.socket).shards == [
        "llm/model-00001-of-00002.safetensors", "llm/model-00002-of-00002.safetensors"]
    daemon.cli("save", "llm", str(tmp_path / "back"), check=True)
    for f in os.listdir(src):
        assert (tmp_path / "back" / f).read_bytes() == (src / f).read_bytes(), f


def test_a_directory_without_index_loads_every_file(daemon, tmp_path):
    tensors = write_sharded(tmp_path, with_index=False)
    daemon.cli("load", str(tmp_path), "d", check=True)
    assert_same(gpumemctl.tensors.load("d", framework="numpy", socket=daemon.socket),
                tensors)


# ---- bad input: one line, exit 2, nothing made --------------------------------------------
def _header_and_data(path: str) -> tuple[dict, bytes]:
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_raw(path, header_bytes: bytes, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return str(path)


def _bad_files(model_file: str, d) -> dict[str, tuple[str, str]]:
    header, data = _header_and_data(model_file)
    raw = open(model_file, "rb").read()
    last = max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"])
    overlap = json.loads(json.dumps(header))
    overlap[last]["data_offsets"][0] -= 2
    overlap[last]["data_offsets"][1] -= 2
    past = json.loads(json.dumps(header))
    start, end = past[last]["data_offsets"]
    past[last].update(dtype="U8", shape=[end + 1000 - start], data_offsets=[start, end + 1000])
    dtype = json.loads(json.dumps(header))
    dtype["positions"]["dtype"] = "I128"
    (d / "truncated.safetensors").write_bytes(raw[:-3])
    return {
        "truncated": (str(d / "truncated.safetensors"), "not fully covered"),
        "not JSON": (_write_raw(d / "notjson.safetensors", b"{weights: 1}", data),
                     "invalid JSON"),
        "overlap": (_write_raw(d / "overlap.safetensors", json.dumps(overlap).encode(), data),
                    "invalid offset"),
        "past the end": (_write_raw(d / "past.safetensors", json.dumps(past).encode(), data),
                         "not fully covered"),
        "unknown dtype": (_write_raw(d / "dtype.safetensors", json.dumps(dtype).encode(), data),
                          "I128"),
    }


def test_bad_files_are_one_line_usage_errors_and_leave_nothing(daemon, model_file, tmp_path):
    for what, (path, words) in _bad_files(model_file, tmp_path).items():
        r = daemon.cli("load", path, "models/bad", check=2)
        err = r.stderr.decode()
        assert err.count("\n") == 1 and path in err and words in err, (what, err)
        assert r.stdout == b""
        assert tree(daemon) == [], what
    assert daemon.cli_json("status")["totals"]["allocations"] == 0


def test_a_missing_shard_or_tensor_is_a_usage_error(daemon, tmp_path):
    write_sharded(tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    os.unlink(tmp_path / "model-00002-of-00002.safetensors")
    err = daemon.cli("load", str(index_path), "llm", check=2).stderr.decode()
    assert "model-00002-of-00002.safetensors is missing" in err and err.count("\n") == 1
    write_sharded(tmp_path)
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    err = daemon.cli("load", str(index_path), "llm", check=2).stderr.decode()
    assert "'ghost'" in err and "does not hold it" in err
    index_path.write_text("{not json")
    assert "not a JSON index" in daemon.cli("load", str(index_path), "llm",
                                            check=2).stderr.decode()
    assert tree(daemon) == []


def test_a_load_that_fails_half_way_removes_what_it_made(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--host-capacity", "64M"])
    save_file({"a": np.ones(6 << 20, np.uint8)}, str(tmp_path / "a.safetensors"))
    save_file({"b": np.ones(80 << 20, np.uint8)}, str(tmp_path / "b.safetensors"))
    err = d.cli("load", str(tmp_path), "models/two", check=7).stderr.decode()
    assert "out of memory" in err
    assert tree(d) == []                                        # not even models/
    assert d.cli_json("status")["totals"]["allocations"] == 0


def test_an_existing_name_is_refused_and_kept(daemon, model_file):
    daemon.cli("create", "m", "--size", "1M", check=True)
    assert "exists" in daemon.cli("load", model_file, "m", check=5).stderr.decode()
    assert daemon.cli_json("info", "m")["size"] == 1 << 20


def test_rewritten_metadata_cannot_point_outside_the_allocation(daemon, model_file):
    daemon.cli("load", model_file, "m", check=True)
    header = json.loads(daemon.cli_json("info", "m")["metadata"]["safetensors"])
    header["positions"]["data_offsets"] = [1 << 30, (1 << 30) + 800]
    with daemon.client() as c:
        c.meta_set("m", "safetensors", json.dumps(header))
    with pytest.raises(UsageError, match="runs past the end"):
        gpumemctl.tensors.load("m", framework="numpy", socket=daemon.socket)
    assert holders(daemon, "m") == []              # nothing left attached after the error
    with pytest.raises(UsageError, match="invalid framework 'tensorflow'"):
        gpumemctl.tensors.load("m", framework="tensorflow", socket=daemon.socket)


def test_jax_arrays_in_place_and_64_bit_only_with_x64(daemon, model_file):
    jax = pytest.importorskip("jax")      # in the test extra: CI has it
    daemon.cli("load", model_file, "m", check=True)
    want = load_file(model_file)
    with pytest.raises(UsageError, match="jax_enable_x64"):
        gpumemctl.tensors.load("m", framework="jax", socket=daemon.socket)
    assert holders(daemon, "m") == []
    jax.config.update("jax_enable_x64", True)
    try:
        weights = gpumemctl.tensors.load("m", framework="jax", socket=daemon.socket)
        for k, v in want.items():
            assert np.asarray(weights[k]).dtype == v.dtype, k
            assert np.asarray(weights[k]).tobytes() == v.tobytes(), k
        assert holders(daemon, "m") == ["attach-r"]
        del weights, v
        gc.collect()
        wait_for(lambda: holders(daemon, "m") == [], what="jax's arrays to let go")
    finally:
        jax.config.update("jax_enable_x64", False)


def test_a_load_killed_half_way_leaves_no_shard(daemon_factory, tmp_path):
    """kill -9 of `gpumemctl load` while it writes the second shard: every shard is still
    `restoring` until all are written, so the daemon removes them all with its session."""
    d = daemon_factory(extra_args=["--host-capacity", "2G"])
    save_file({"a": np.ones(8 << 20, np.uint8)}, str(tmp_path / "a.safetensors"))
    save_file({"b": np.ones(768 << 20, np.uint8)}, str(tmp_path / "b.safetensors"))
    proc = subprocess.Popen(script_argv("gpumemctl") + ["--socket", d.socket, "load",
                                                         str(tmp_path), "llm"],
                            env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        with d.client() as c:
            def second_begun():
                try:
                    return c.info("llm/b.safetensors")["state"] == "restoring"
                except NotFound:
                    return False
            wait_for(second_begun, timeout=60, interval=0.002, what="the second shard")
            assert c.info("llm/a.safetensors")["state"] == "restoring"   # written, unfinished
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: [e["path"] for e in d.cli_json("ls", "-R")] == ["llm"],
             what="the daemon to remove the shards of the dead load")
    assert d.cli_json("status")["totals"]["allocations"] == 0
