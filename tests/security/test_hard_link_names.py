"""A hard-linked file's names inside a directory the caller may not search stay hidden (issue
24, item 13). Before, `info` listed every name: uid 65534 saw `v2/HIDHARD7`, a name root
had given 65534's file inside root's 0700 directory, and a file whose first name was inside
it showed that name as its `path`. Now `info`, the answers that carry a node (open,
attach), the listing and the mount's `.metadata` mirror name only what the caller may search
to, as `ls` and `verify --all` do; `links` stays the true count (stat shows it anyway), and
root sees every name."""
from __future__ import annotations

import json
import mmap  # noqa: F401 - Client.open maps the memory; the child cannot import it
import os

import pytest

from gpumemctl import Client
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def _mine(sock: str) -> None:
    with Client(sock) as c:
        c.create("pub/mine", 4096, mode=0o644)


def _look(sock: str) -> dict:
    with Client(sock) as c:
        handle = c.open("pub/model", "r")
        opened = handle.info
        handle.close()
        return json.loads(json.dumps({
            "model": c.info("pub/model"), "mine": c.info("pub/mine"),
            "listing": c.ls("pub"), "opened": opened}))


def _hidden_setup(d) -> None:
    """root's 0700 `v2` holds the first name of root's `model` and a second name of
    65534's `mine`; both are also in the public `pub`."""
    d.cli("mkdir", "v2", "--mode", "0700", check=True)
    d.cli("mkdir", "pub", "--mode", "0777", check=True)
    d.cli("create", "v2/model", "--size", "4K", "--mode", "0644", check=True)
    d.cli("ln", "v2/model", "pub/model", check=True)
    run_as(_mine, d.socket)
    d.cli("ln", "pub/mine", "v2/HIDHARD7", check=True)


def test_info_names_only_what_the_caller_may_search_to(daemon):
    _hidden_setup(daemon)
    seen = run_as(_look, daemon.socket)
    assert "v2/" not in json.dumps(seen), seen
    assert (seen["model"]["path"], seen["model"]["names"], seen["model"]["links"]) == \
        ("pub/model", ["pub/model"], 2)
    assert (seen["mine"]["names"], seen["mine"]["links"]) == (["pub/mine"], 2)
    assert seen["opened"]["path"] == "pub/model"
    assert {e["path"]: e["links"] for e in seen["listing"]} == {"pub/mine": 2,
                                                                "pub/model": 2}
    root = daemon.cli_json("info", "pub/mine")                  # root sees every name
    assert root["names"] == ["pub/mine", "v2/HIDHARD7"]
    assert daemon.cli_json("info", "pub/model")["names"] == ["v2/model", "pub/model"]


def _read_mirror(mnt: str) -> dict:
    out = {}
    for name in ("model", "mine"):
        with open(os.path.join(mnt, ".metadata", "pub", name)) as f:
            out[name] = json.load(f)
        out[f"{name}_nlink"] = os.stat(os.path.join(mnt, "pub", name)).st_nlink
    return out


def test_the_mount_metadata_mirror_names_only_what_the_caller_may_search_to(mounted):
    _hidden_setup(mounted)
    seen = run_as(_read_mirror, mounted.mnt)
    assert "v2/" not in json.dumps(seen), seen
    assert seen["model"]["names"] == ["pub/model"] and seen["model"]["path"] == "pub/model"
    assert seen["mine"]["names"] == ["pub/mine"]
    assert seen["model_nlink"] == seen["mine_nlink"] == 2     # the true count
    with open(os.path.join(mounted.mnt, ".metadata", "pub", "mine")) as f:
        assert json.load(f)["names"] == ["pub/mine", "v2/HIDHARD7"]   # root: all


def _verify_and_recover(sock: str) -> dict:
    frames: list[dict] = []
    with Client(sock) as c:
        verified = c.verify(all=True, progress=frames.append)
        recovered = c.recover("pub/mine")
        scrub = c.scrub("status")
    return json.loads(json.dumps({"verified": verified, "frames": frames,
                                  "recovered": recovered, "scrub": scrub}))


def test_verify_recover_and_scrub_status_name_only_what_the_caller_may_search_to(daemon):
    """verify --all, its progress frames, recover and scrub status named an allocation by
    its first name, which for `model` is inside root's 0700 `v2`."""
    _hidden_setup(daemon)
    daemon.cli("scrub", "start", "--wait", check=True)
    seen = run_as(_verify_and_recover, daemon.socket)
    assert "v2/" not in json.dumps(seen), seen
    assert sorted(r["path"] for r in seen["verified"]["allocations"]) == ["pub/mine",
                                                                         "pub/model"]
    assert seen["frames"] and all(f["path"] in ("pub/mine", "pub/model", None)
                                  for f in seen["frames"])
    assert seen["recovered"]["allocation"]["path"] == "pub/mine"
    assert seen["recovered"]["info"]["path"] == "pub/mine"
    root = daemon.cli_json("verify", "--all")                 # root: first names
    assert sorted(r["path"] for r in root["allocations"]) == ["pub/mine", "v2/model"]
