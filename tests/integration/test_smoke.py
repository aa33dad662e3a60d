"""The happy path through the CLI: create, write, read back, list, remove."""
from __future__ import annotations


def test_create_write_read_rm(daemon):
    daemon.cli("create", "models/llama", "--size", "3M", "--durable", check=True)
    data = bytes(range(256)) * 100
    daemon.cli("write", "models/llama", "-", input=data, check=True)
    out = daemon.cli("read", "models/llama", "--length", str(len(data)), check=True).stdout
    assert out == data
    entries = daemon.cli_json("ls", "-R")
    alloc = next(e for e in entries if e["path"] == "models/llama")
    assert alloc["size"] == 3 << 20 and alloc["capacity"] == 4 << 20
    assert alloc["durable"] is True and alloc["state"] == "ready"
    daemon.cli("rm", "models/llama", check=True)
    assert daemon.cli("info", "models/llama", check=4).stderr.startswith(b"gpumemctl: error:")
