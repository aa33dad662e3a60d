"""A directory chain deeper than Python's recursion limit, renamed and chmod'ed through the
mount: both decide from the whole subtree whether the change must be fsynced (a durable
allocation below), a walk that must not recurse (daemon/nodes.walk)."""
from __future__ import annotations

import os

DEPTH = 1500


def test_rename_and_chmod_of_a_1500_deep_chain(mounted):
    chain = "/".join(["d"] * DEPTH)
    with mounted.client() as c:
        c.mkdir(chain, parents=True)
        c.create(chain + "/leaf", "1M", durable=True)
    os.rename(os.path.join(mounted.mnt, "d"), os.path.join(mounted.mnt, "e"))
    os.chmod(os.path.join(mounted.mnt, "e"), 0o700)
    leaf = "e/" + "/".join(["d"] * (DEPTH - 1)) + "/leaf"
    assert mounted.cli_json("info", leaf)["durable"] is True
    assert oct(os.stat(os.path.join(mounted.mnt, "e")).st_mode & 0o777) == "0o700"
