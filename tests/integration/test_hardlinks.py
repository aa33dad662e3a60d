"""Hard links through the socket API and the CLI (issue 15): `gpumemctl ln TARGET NAME`, one
allocation under several names, `info`'s names, `ls -l`'s link count, memory freed with the
last name, durability across a kill -9, and who may link (docs/protocol.md, "Hard links")."""
from __future__ import annotations

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.sizes import MiB
from tests.users import run_as


def totals(d) -> tuple[int, int]:
    t = d.cli_json("status")["totals"]
    return t["allocations"], t["capacity"]


def test_ln_gives_one_allocation_a_second_name(daemon):
    daemon.cli("create", "models/v2", "--size", "1M", check=True)
    daemon.cli("write", "models/v2", input=b"the weights", check=True)
    daemon.cli("mkdir", "pinned", check=True)
    made = daemon.cli_json("ln", "models/v2", "pinned/v2-keep")
    assert (made["path"], made["links"]) == ("pinned/v2-keep", 2)
    assert "names" not in made                  # `info` lists them (issue 24: O(1) links)
    info = daemon.cli_json("info", "pinned/v2-keep")
    assert info["id"] == daemon.cli_json("info", "models/v2")["id"]
    assert info["names"] == ["models/v2", "pinned/v2-keep"] and info["links"] == 2
    human = daemon.cli("info", "models/v2", check=True).stdout.decode()
    assert "names              models/v2, pinned/v2-keep" in human
    long = daemon.cli("ls", "-l", "pinned", check=True).stdout.decode().splitlines()
    assert long[0].split()[9] == "LINKS" and long[1].split()[9] == "2", long
    assert long[1].split()[-1] == "pinned/v2-keep"
    assert [e["path"] for e in daemon.cli_json("ls", "-R")] == \
        ["models", "models/v2", "pinned", "pinned/v2-keep"]
    assert daemon.cli("read", "pinned/v2-keep", "--length", "11", check=True).stdout == \
        b"the weights"
    assert totals(daemon) == (1, daemon.cli_json("info", "models/v2")["capacity"])

    daemon.cli("rm", "models/v2", check=True)             # one name goes, the memory stays
    info = daemon.cli_json("info", "pinned/v2-keep")
    assert (info["path"], info["names"], info["links"]) == \
        ("pinned/v2-keep", ["pinned/v2-keep"], 1)
    assert daemon.cli("read", "pinned/v2-keep", "--length", "11", check=True).stdout == \
        b"the weights"
    assert totals(daemon)[0] == 1
    removes = [e for e in daemon.cli_json("events") if e["kind"] == "remove"]
    assert removes[-1]["detail"] == {"force": False, "name": "models/v2", "links_left": 1}
    daemon.cli("rm", "pinned/v2-keep", check=True)        # the last name: freed
    assert totals(daemon) == (0, 0)
    daemon.cli("check", check=True)


def test_ln_refusals_are_clear(daemon):
    daemon.cli("create", "f", "--size", "4K", check=True)
    daemon.cli("mkdir", "d", check=True)
    err = daemon.cli("ln", "d", "d2", check=6).stderr.decode()
    assert "a directory cannot have a second name" in err and err.count("\n") == 1, err
    assert "already exists" in daemon.cli("ln", "f", "d", check=5).stderr.decode()
    daemon.cli("ln", "nothing", "n", check=4)
    daemon.cli("ln", "f", "no/such/dir/x", check=4)
    daemon.cli("ln", "f", ".metadata", check=2)          # reserved at the top level
    daemon.cli("check", check=True)


def test_rename_and_rm_with_hard_links(daemon):
    """rm -r of a directory holding both names frees the memory; rm of one name of a file
    held open is not busy (the other name keeps it); `ls` shows each name's link count."""
    with Client(daemon.socket) as c:
        c.create("d/a", MiB)
        c.link("d/a", "d/b")
        c.create("e", MiB)
        c.link("e", "d/e2")
        handle = c.open("e", "r")
        c.remove("d/e2")                                  # not busy: "e" keeps it
        assert c.info("e")["links"] == 1
        handle.close()
        c.remove("d", recursive=True)
        assert {x["path"] for x in c.ls("", recursive=True)} == {"e"}
        c.create("x", 4096)
        c.link("x", "y")
        assert [n["links"] for n in c.ls("")] == [1, 2, 2]
    daemon.cli("check", check=True)
    assert totals(daemon)[0] == 2


def test_hard_links_survive_kill9_and_restart(daemon):
    """A durable allocation with two names: after kill -9 and restart both names are there,
    with the same id, the bytes and a link count of 2; removing one then the other works."""
    daemon.cli("create", "a/model", "--size", "2M", "--durable", check=True)
    daemon.cli("write", "a/model", input=b"durable bytes", check=True)
    daemon.cli("mkdir", "b", check=True)
    daemon.cli("ln", "a/model", "b/alias", check=True)
    daemon.cli("ln", "a/model", "b/alias2", check=True)
    daemon.cli("rm", "a/model", check=True)          # the first name goes: the next moves up
    ident = daemon.cli_json("info", "b/alias")["id"]
    daemon.restart(hard=True)
    info = daemon.cli_json("info", "b/alias2")
    assert (info["id"], info["links"], info["state"]) == (ident, 2, "ready")
    assert info["names"] == ["b/alias", "b/alias2"]
    assert daemon.cli("read", "b/alias", "--length", "13", check=True).stdout == \
        b"durable bytes"
    daemon.cli("check", check=True)
    daemon.restart(hard=False)
    daemon.cli("rm", "b/alias", check=True)
    assert daemon.cli_json("info", "b/alias2")["links"] == 1
    daemon.cli("check", check=True)


def _link_as(sock: str, target: str, name: str):
    try:
        with Client(sock) as c:
            return c.link(target, name)["links"]
    except GpumemError as exc:
        return exc.details.get("errno", exc.code)


def test_only_owner_or_a_reader_writer_may_link(daemon):
    """Linux's protected_hardlinks: uid 65534 may not give root's 0644 file a name in a
    directory of its own (it could pin it there), may link a file it can read and write,
    and never a set-id one."""
    with Client(daemon.socket) as c:
        c.mkdir("open", mode=0o777)
        c.create("mine", 4096, mode=0o644)
        c.create("shared", 4096, mode=0o666)
        c.create("setid", 4096, mode=0o4666)
    assert run_as(_link_as, daemon.socket, "mine", "open/pin") == "EPERM"
    assert run_as(_link_as, daemon.socket, "shared", "open/s") == 2
    assert run_as(_link_as, daemon.socket, "setid", "open/x") == "EPERM"
    with Client(daemon.socket) as c:
        assert c.info("shared")["names"] == ["shared", "open/s"]
        assert c.info("mine")["links"] == c.info("setid")["links"] == 1
    daemon.cli("check", check=True)


def test_each_name_counts_towards_max_names_per_uid(daemon_factory, tmp_path):
    config = tmp_path / "gpumemd.toml"
    config.write_text("max_names_per_uid = 3\n")
    d = daemon_factory(extra_args=["--config", str(config)])
    with Client(d.socket) as c:
        c.mkdir("open", mode=0o777)

    def make(sock):
        with Client(sock) as c:
            c.create("open/f", 4096)
            c.link("open/f", "open/g")
            c.link("open/f", "open/h")
            try:
                c.link("open/f", "open/i")
            except GpumemError as exc:
                return exc.code
            return 0
    assert run_as(make, d.socket) == 7                      # NoMemory: EDQUOT
    d.cli("check", check=True)
