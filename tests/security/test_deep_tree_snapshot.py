"""A user's tree must not stop root's listing of everything (issue 24, item 7).

While uid 65534 owned a tree whose recursive listing was 68 MB of JSON, root's `snapshot
create STORE` (no names: every durable allocation, found with `ls("", recursive=True)`)
failed with "the answer would be 68733718 bytes, more than 67108864". `ls` now pages (`limit`
and `after`; a page is bounded in entries and in bytes) and the client pages until done.

The tree here is built quickly through the socket (about 2 s): 2,700 directories whose paths
are the longest a request may name (4,096 bytes), of bytes that are not UTF-8, which JSON
spells six characters each (`\\udcff`): about 26 KB an entry, 70 MB in all. A chain deeper
than any path (made through the mount) is listed down to the paths a request can name."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from daemon.core.listing import PAGE_BYTES
from daemon.server.transport import MAX_ANSWER_BYTES
from gpumemctl import Client
from gpumemctl.protocol import GpumemError, framing
from tests.longnames import CHAIN, leaf
from tests.users import run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

LEAVES = 2_700                                       # x ~26 KB: past MAX_ANSWER_BYTES
USAGE = 2


def _build_tree(sock: str) -> dict:
    with Client(sock, timeout=120) as c:
        c.mkdir(CHAIN, parents=True)
        for i in range(LEAVES):
            c.mkdir(f"{CHAIN}/{leaf(i)}")
    return {"built": LEAVES}


def _answer_bytes(entries: list[dict]) -> int:
    return len(framing.encode({"id": 1, "ok": True, "result": {"entries": entries}}))


def tree_order(path: str) -> list[str]:
    """The key a listing is ordered by: pre-order, by name within a directory."""
    return path.split("/")


def test_a_users_huge_tree_does_not_stop_roots_snapshot(daemon, request):
    run_as(_build_tree, daemon.socket, timeout=300)
    store = tempfile.mkdtemp(prefix="gpumem-snapstore-")
    request.addfinalizer(lambda: shutil.rmtree(store, ignore_errors=True))
    with daemon.client() as c:
        c.create("rootdata", 1 << 20, durable=True)
        c.write("rootdata", b"root's own bytes", offset=0)
        # An old client's single answer is still refused, as before: too large to send.
        with pytest.raises(GpumemError) as refused:
            c.call("ls", path="", recursive=True)
        assert refused.value.code == USAGE
        assert refused.value.details["bytes"] > MAX_ANSWER_BYTES

    made = daemon.cli_json("snapshot", "create", store)         # failed with exit 2
    assert [a["path"] for a in made["allocations"]] == ["rootdata"], made["allocations"]
    assert os.path.isfile(os.path.join(store, made["snapshot"], "manifest.json"))
    with daemon.client() as c:
        assert c.info("rootdata")["snapshot"] == made["location"]

    listing = daemon.cli_json("ls", "-R")                        # root's CLI pages too
    paths = [e["path"] for e in listing]
    assert len(paths) == len(set(paths)) == 15 + LEAVES + 1
    assert paths == sorted(paths, key=tree_order)
    assert _answer_bytes(listing) > MAX_ANSWER_BYTES             # more than one answer holds
    assert daemon.cli("verify", "--all").returncode == 0


def test_pages_are_bounded_and_go_on_after_a_removed_cursor(daemon):
    run_as(_build_tree, daemon.socket, timeout=300)
    with daemon.client() as c:
        c.mkdir("zz")
        whole = [e["path"] for e in c.walk("")]
        first = c.call("ls", path="", recursive=True, limit=10_000)
        assert 0 < len(first["entries"]) < len(whole)
        assert _answer_bytes(first["entries"]) <= PAGE_BYTES      # bounded in bytes
        assert first["next"] == first["entries"][-1]["path"]
        # The cursor's entry goes before the next page is asked for: the listing goes on
        # after it, by name, as if it were still there.
        cursor = first["next"]
        c.remove(cursor, recursive=True)
        rest = [e["path"] for e in c.walk("") if tree_order(e["path"]) > tree_order(cursor)]
        page = c.call("ls", path="", recursive=True, limit=10_000, after=cursor)
        assert [e["path"] for e in page["entries"]] == rest[:len(page["entries"])]
        assert cursor not in rest and len(page["entries"]) > 0
        few = c.call("ls", path="", recursive=True, limit=3, after=cursor)
        assert [e["path"] for e in few["entries"]] == rest[:3]
        last = c.call("ls", path="", recursive=True, after=whole[-2])
        assert ([e["path"] for e in last["entries"]], last["next"]) == ([whole[-1]], None)
        # A cursor from another listing is refused in one line, naming it.
        with pytest.raises(GpumemError) as bad:
            c.call("ls", path="zz", recursive=True, after="elsewhere/x")
        assert bad.value.code == USAGE and "'elsewhere/x'" in str(bad.value)


def _private_tree(sock: str) -> dict:
    with Client(sock) as c:
        c.mkdir("mine", mode=0o700)
        c.mkdir("mine/secret/inner", parents=True)
        c.mkdir("mine/secret/zeta")
        c.mkdir("public", mode=0o755)
    return {}


def _list_after(sock: str, after: str) -> list[str]:
    with Client(sock) as c:
        return [e["path"] for e in c.call("ls", path="", recursive=True, after=after)["entries"]]


def test_a_cursor_leads_only_where_the_listing_goes(daemon):
    """A cursor through a directory the caller may not list shows nothing of what is in it."""
    run_as(_private_tree, daemon.socket)
    with daemon.client() as c:
        c.mkdir("other", mode=0o700)
        c.mkdir("other/hidden")
    assert run_as(_list_after, daemon.socket, "other/a", uid=65533, gid=65533) == \
        ["public"]
    assert run_as(_list_after, daemon.socket, "mine/secret/a", uid=65533, gid=65533) == \
        ["other", "public"]                        # the names, never what they hold
    assert run_as(_list_after, daemon.socket, "mine/secret/a") == \
        ["mine/secret/inner", "mine/secret/zeta", "other", "public"]


def test_a_chain_deeper_than_any_path_lists_what_can_be_named(mounted):
    """Through the mount a chain has no depth limit; listing every path of a chain n deep
    costs n² bytes. A listing stops at the paths a request may name (4,096 bytes)."""
    depth = 2_500                                  # "d/d/...": 4,999 bytes at the bottom
    fd = os.open(mounted.mnt, os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    listed = [e["path"] for e in mounted.cli_json("ls", "-R")]
    assert len(listed) == 2_048                    # "d" x 2,048 is 4,095 bytes
    assert listed[-1] == "/".join(["d"] * 2_048)
