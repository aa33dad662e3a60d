"""A directory chain deeper than Python's recursion limit: any user can make one in a fraction
of a second, so every walk of the tree (listing, verify --all, recursive removal, the durable
check of a rename or chmod) must be a loop, never recursion (daemon/nodes.walk)."""
from __future__ import annotations

import sys

DEPTH = 1500          # deeper than sys.getrecursionlimit() (1000), within the 4096-byte path


def test_a_1500_deep_chain_lists_verifies_and_removes(daemon):
    assert DEPTH > sys.getrecursionlimit()
    chain = "/".join(["d"] * DEPTH)
    with daemon.client() as c:
        c.mkdir(chain, parents=True)
        c.create(chain + "/leaf", "1M", durable=True)
        c.write(chain + "/leaf", b"deep", offset=0)

    listing = daemon.cli_json("ls", "-R")
    paths = [entry["path"] for entry in listing]
    assert len(paths) == DEPTH + 1
    assert paths[-1] == chain + "/leaf"                 # pre-order: the leaf comes last

    verified = daemon.cli("verify", "--all")
    assert verified.returncode == 0, verified.stderr

    marked = daemon.cli("durable", "d")     # a directory: its durable default (issue 27)
    assert marked.returncode == 0, marked.stderr
    assert daemon.cli_json("info", "d")["durable"] is True
    daemon.cli("transient", chain + "/leaf", check=True)
    daemon.cli("rm", "-r", "d", check=True)
    assert daemon.cli_json("ls") == []
    assert daemon.cli("check").returncode == 0
