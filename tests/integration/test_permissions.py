"""Permissions for a second uid, through the socket API.

The daemon authorises every request from the peer's SO_PEERCRED credentials with POSIX rules
(daemon/core/permissions.py, daemon/verbs/). To be a real second uid these tests fork
(tests/users.py run_as): the child drops to nobody (uid/gid 65534, no supplementary groups)
and talks to the daemon with gpumemctl.Client, imported here before forking (the venv's
interpreter and stdlib live under /root, which uid 65534 cannot read, so nothing may be
imported after the drop). The child reports what happened as JSON through a pipe and always
leaves with os._exit().

The rules asserted (the same as a POSIX filesystem mounted with default_permissions):
- resolving a path needs search (x) on every directory on the way;
- `info` is stat(): search on the directories only, nothing on the allocation itself;
- open for reading needs r, read-write needs r and w, on the allocation;
- listing a directory needs r and x on it; creating or removing an entry needs w and x on
  the directory; in a sticky directory (the root is 1777) only the entry's owner, the
  directory's owner or root may remove an entry, whatever the entry's own mode;
- durable/transient is the owner's (or root's) decision (like chmod/chown);
- the owner class is chosen by uid, else the group class by gid/supplementary groups, else
  other: a class's bits apply even when they are fewer than other's.

This module needs to run as root (to switch uid); it skips otherwise.
"""
from __future__ import annotations

import errno
import mmap
import os

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError, PermissionDenied, framing
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")

MiB = 1 << 20
PERMISSION = PermissionDenied.code      # 6
assert PERMISSION == 6


def attempt(fn, *args, **kw) -> dict:
    """The outcome of one call, as JSON: the value, or the error's class, code and message."""
    try:
        value = fn(*args, **kw)
    except GpumemError as exc:
        return {"error": type(exc).__name__, "code": exc.code, "message": str(exc)}
    except OSError as exc:
        return {"error": type(exc).__name__, "errno": exc.errno, "message": str(exc)}
    if isinstance(value, (bytes, bytearray)):
        value = {"bytes": bytes(value).hex()}
    return {"value": value}


def denied(outcome: dict) -> bool:
    return outcome.get("error") == "PermissionDenied" and outcome.get("code") == PERMISSION


def assert_denied(outcome: dict, *words: str) -> None:
    assert denied(outcome), outcome
    for word in words:
        assert word in outcome["message"], outcome


def own_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def snapshot(c: Client, path: str) -> dict:
    """What must not change when someone else is refused."""
    info = c.info(path)
    return {"bytes": c.read(path), "durable": info["durable"], "mode": info["mode"],
            "uid": info["uid"], "gid": info["gid"], "size": info["size"],
            "state": info["state"], "modified": info["modified"], "holders": info["holders"]}


# ---- default mode 0600: private to root ------------------------------------------------------

def _probe_private(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {"uid": os.getuid()}
    res["info"] = attempt(c.info, "secret")
    res["ls_root"] = attempt(lambda: [e["path"] for e in c.ls("")])
    res["open_r"] = attempt(lambda: c.open("secret", "r").info)
    res["open_rw"] = attempt(lambda: c.open("secret", "rw").info)
    res["read"] = attempt(c.read, "secret")
    res["write"] = attempt(c.write, "secret", b"overwritten by nobody")
    # The raw exchange: the refused open carries no fd, and none turns up in this process.
    before = own_fd_count()
    raw = {}
    for i, mode in enumerate(("r", "rw")):
        framing.send_frame(c.sock, {"id": 1000 + i, "op": "open",
                                    "args": {"path": "secret", "mode": mode}})
        reply, fds = framing.recv_frame(c.sock, framing.MAX_RESPONSE_BYTES)
        raw[mode] = {"reply": reply, "nfds": len(fds)}
        framing.close_fds(fds)
    res["raw_open"] = raw
    res["fds_before"], res["fds_after"] = before, own_fd_count()
    res["rm"] = attempt(c.remove, "secret")
    res["rm_force"] = attempt(c.remove, "secret", force=True)
    res["durable_secret"] = attempt(c.set_durable, "secret", True)
    res["transient_secret"] = attempt(c.set_durable, "secret", False)
    res["transient_vault"] = attempt(c.set_durable, "vault", False)
    res["durable_vault"] = attempt(c.set_durable, "vault", True)
    res["create_exist_ok"] = attempt(c.create, "secret", MiB, exist_ok=True)
    res["create_exist_ok_durable"] = attempt(c.create, "secret", MiB, exist_ok=True,
                                             durable=True)
    res["create_over"] = attempt(c.create, "secret", MiB)
    res["read_vault"] = attempt(c.read, "vault")
    res["rm_vault"] = attempt(c.remove, "vault")
    res["still_usable"] = attempt(lambda: c.status()["daemon"]["pid"])
    c.close()
    return res


def test_private_allocation_is_closed_to_another_uid(daemon):
    secret = os.urandom(MiB)
    vault = os.urandom(4096)
    with daemon.client() as c:
        assert c.create("secret", MiB)["mode"] == "0600"          # the default
        c.write("secret", secret)
        assert c.create("vault", 4096, durable=True)["mode"] == "0600"
        c.write("vault", vault)
        before = {p: snapshot(c, p) for p in ("secret", "vault")}
        assert before["secret"]["durable"] is False and before["vault"]["durable"] is True

    res = run_as(_probe_private, daemon.socket)
    assert res["uid"] == NOBODY

    # info is stat(): it needs only search permission on the directories on the way (the
    # root is 1777), nothing on the allocation itself. So nobody may see the metadata,
    # exactly as `stat /mnt/secret` works on a 0600 file in a searchable directory.
    assert "value" in res["info"], res["info"]
    assert res["info"]["value"]["uid"] == 0 and res["info"]["value"]["mode"] == "0600"
    assert sorted(res["ls_root"]["value"]) == ["secret", "vault"]   # the root is 1777: rx

    for key in ("open_r", "read", "read_vault"):
        assert_denied(res[key], "read")
    for key in ("open_rw", "write"):
        assert_denied(res[key])
    # no fd rides on a refusal, and none appeared in the child
    for mode in ("r", "rw"):
        reply = res["raw_open"][mode]["reply"]
        assert reply["ok"] is False and reply["error"]["code"] == PERMISSION, reply
        assert res["raw_open"][mode]["nfds"] == 0
    assert res["fds_after"] == res["fds_before"]
    # removal in the sticky root: not the entry's owner, not the root's owner
    for key in ("rm", "rm_force", "rm_vault"):
        assert_denied(res[key], "sticky")
    # durability is the owner's call; asking through an idempotent create is no way around it
    for key in ("durable_secret", "transient_secret", "transient_vault", "durable_vault",
                "create_exist_ok_durable"):
        assert_denied(res[key], "owner")
    assert_denied(res["create_exist_ok"])            # exist_ok needs read on what exists
    assert res["create_over"]["code"] == 5            # plain create of an existing name
    assert res["still_usable"] == {"value": daemon.proc.pid}   # refusals keep the session

    with daemon.client() as c:
        after = {p: snapshot(c, p) for p in ("secret", "vault")}
        assert after == before
        assert after["secret"]["bytes"][:MiB] == secret
        assert after["vault"]["bytes"] == vault
        assert c.status()["totals"]["holders"] == 0
    assert daemon.proc.poll() is None


# ---- mode 0644: readable, not writable -------------------------------------------------------

def _probe_readable(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {}
    res["read"] = attempt(c.read, "pub")
    res["write"] = attempt(c.write, "pub", b"nobody was here")
    res["open_rw"] = attempt(lambda: c.open("pub", "rw").info)
    result, fds = c.call_fds("open", path="pub", mode="r")
    res["nfds"] = len(fds)
    fd = fds[0]
    cap = result["info"]["capacity"]
    try:
        m = mmap.mmap(fd, cap, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m[:4] = b"EVIL"
        m.close()
        res["mmap_shared_write"] = {"value": "mapped writable"}
    except OSError as exc:
        res["mmap_shared_write"] = {"error": type(exc).__name__, "errno": exc.errno}
    m = mmap.mmap(fd, cap, mmap.MAP_SHARED, mmap.PROT_READ)
    res["mmap_read"] = m[:16].hex()
    m.close()
    res["os_write"] = attempt(os.write, fd, b"EVIL")
    res["ftruncate"] = attempt(os.ftruncate, fd, 0)
    os.close(fd)
    res["close_handle"] = attempt(c.call, "close", handle=result["handle"])
    res["durable"] = attempt(c.set_durable, "pub", True)
    res["rm"] = attempt(c.remove, "pub")
    c.close()
    return res


def test_world_readable_allocation_is_read_only_to_another_uid(daemon):
    data = os.urandom(64 * 1024)
    with daemon.client() as c:
        c.create("pub", 64 * 1024, mode=0o644)
        c.write("pub", data)
        before = snapshot(c, "pub")

    res = run_as(_probe_readable, daemon.socket)
    assert bytes.fromhex(res["read"]["value"]["bytes"]) == data
    assert_denied(res["write"])
    assert_denied(res["open_rw"])
    assert res["nfds"] == 1
    # the fd of a read-only open is read-only: no shared writable mapping, no write(2)
    assert res["mmap_shared_write"] == {"error": "PermissionError", "errno": errno.EACCES}
    assert bytes.fromhex(res["mmap_read"]) == data[:16]
    assert res["os_write"]["errno"] == errno.EBADF
    assert res["ftruncate"]["errno"] in (errno.EINVAL, errno.EBADF)
    assert res["close_handle"] == {"value": {}}
    assert_denied(res["durable"], "owner")
    assert_denied(res["rm"], "sticky")

    with daemon.client() as c:
        assert snapshot(c, "pub") == before
        assert c.read("pub") == data


def _probe_reopen(sock: str) -> dict:
    c = Client(sock, timeout=20)
    result, fds = c.call_fds("open", path="pub", mode="r")
    fd = fds[0]
    res = {"fd_mode": oct(os.fstat(fd).st_mode & 0o7777)}
    # /proc/self/fd/N reopens the file itself (a new open file description), checked
    # against the inode's own mode bits, not against the fd's access mode.
    try:
        fd2 = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
    except OSError as exc:
        res["reopen_rw"] = {"error": type(exc).__name__, "errno": exc.errno}
    else:
        res["reopen_rw"] = {"value": "opened read-write"}
        try:
            m = mmap.mmap(fd2, result["info"]["capacity"], mmap.MAP_SHARED,
                          mmap.PROT_READ | mmap.PROT_WRITE)
            m[:6] = b"PWNED!"
            m.close()
            res["wrote"] = True
        finally:
            os.close(fd2)
    os.close(fd)
    c.call("close", handle=result["handle"])
    c.close()
    return res


def test_read_only_fd_cannot_be_upgraded_by_reopening_it(daemon):
    """A reader must not turn its read-only fd into a writable one by reopening it through
    /proc/self/fd. With the host backend the fd is a memfd whose inode is created mode 0777
    and owned by the daemon's uid, so the reopen's permission check passes for anyone unless
    the daemon restricts the memfd's mode (fchmod 0600) when it creates it."""
    data = os.urandom(4096)
    with daemon.client() as c:
        c.create("pub", 4096, mode=0o644)
        c.write("pub", data)

    res = run_as(_probe_reopen, daemon.socket)
    with daemon.client() as c:
        now = c.read("pub")
    assert now == data, f"uid {NOBODY} wrote to a 0644 allocation of root's: {now[:8]!r}"
    assert res["reopen_rw"] == {"error": "PermissionError", "errno": errno.EACCES}, res


# ---- nobody's own allocations, the sticky root -----------------------------------------------

def _probe_own(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {}
    res["create"] = attempt(c.create, "nobody-1", MiB)
    res["create_nested"] = attempt(c.create, "nobodydir/deep/x", 4096, mode=0o640)
    res["write"] = attempt(c.write, "nobody-1", b"mine")
    res["read"] = attempt(c.read, "nobody-1", 0, 4)
    res["create_2"] = attempt(c.create, "nobody-2", 4096, durable=True)
    res["transient_2"] = attempt(lambda: c.set_durable("nobody-2", False)["durable"])
    res["durable_2"] = attempt(lambda: c.set_durable("nobody-2", True)["durable"])
    res["create_3"] = attempt(c.create, "nobody-3", 4096)
    res["rm_3"] = attempt(c.remove, "nobody-3")
    # root's world-writable allocation in the sticky root: usable, not removable
    res["shared_write"] = attempt(c.write, "shared", b"nobody wrote this")
    res["shared_read"] = attempt(c.read, "shared", 0, 17)
    res["shared_rm"] = attempt(c.remove, "shared")
    res["shared_rm_force"] = attempt(c.remove, "shared", force=True)
    res["shared_durable"] = attempt(c.set_durable, "shared", True)
    # the same in a root-owned 0777 directory without the sticky bit: POSIX lets anyone
    # with w+x on the directory unlink any entry in it, whatever the entry's mode
    res["open_dir_read"] = attempt(c.read, "opendir/private")
    res["open_dir_rm"] = attempt(c.remove, "opendir/private")
    res["open_dir_create"] = attempt(lambda: c.create("opendir/nobody", 4096)["uid"])
    # and a sticky 1777 directory of root's below the root
    res["sticky_dir_rm"] = attempt(c.remove, "stickydir/rootfile")
    res["sticky_dir_own"] = attempt(lambda: c.create("stickydir/mine", 4096)["uid"])
    res["sticky_dir_rm_own"] = attempt(c.remove, "stickydir/mine")
    c.close()
    return res


def test_another_uid_owns_what_it_creates_and_the_sticky_root_protects_others(daemon):
    with daemon.client() as c:
        c.create("shared", MiB, mode=0o666)
        c.mkdir("opendir", mode=0o777)
        c.create("opendir/private", 4096)                     # 0600, root's
        c.mkdir("stickydir", mode=0o1777)
        c.create("stickydir/rootfile", 4096, mode=0o666)

    res = run_as(_probe_own, daemon.socket)

    created = res["create"]["value"]
    assert created["uid"] == NOBODY and created["gid"] == NOBODY and created["mode"] == "0600"
    nested = res["create_nested"]["value"]
    assert nested["uid"] == NOBODY and nested["mode"] == "0640"
    assert res["write"] == {"value": None}
    assert bytes.fromhex(res["read"]["value"]["bytes"]) == b"mine"
    assert res["create_2"]["value"]["durable"] is True
    assert res["transient_2"] == {"value": False} and res["durable_2"] == {"value": True}
    assert res["rm_3"] == {"value": ["nobody-3"]}

    assert res["shared_write"] == {"value": None}                      # 0666: rw for all
    assert bytes.fromhex(res["shared_read"]["value"]["bytes"]) == b"nobody wrote this"
    assert_denied(res["shared_rm"], "sticky")
    assert_denied(res["shared_rm_force"], "sticky")
    assert_denied(res["shared_durable"], "owner")

    assert_denied(res["open_dir_read"], "read")
    assert res["open_dir_rm"] == {"value": ["opendir/private"]}
    assert res["open_dir_create"] == {"value": NOBODY}

    assert_denied(res["sticky_dir_rm"], "sticky")
    assert res["sticky_dir_own"] == {"value": NOBODY}
    assert res["sticky_dir_rm_own"] == {"value": ["stickydir/mine"]}

    with daemon.client() as c:
        for path in ("nobody-1", "nobody-2"):
            info = c.info(path)
            assert (info["uid"], info["gid"], info["mode"]) == (NOBODY, NOBODY, "0600")
        assert c.info("nobody-2")["durable"] is True
        for path in ("nobodydir", "nobodydir/deep"):       # made by mkdir -p, as nobody
            d = c.info(path)
            assert d["type"] == "directory" and d["uid"] == NOBODY and d["mode"] == "0755"
        assert c.info("nobodydir/deep/x")["uid"] == NOBODY
        assert c.read("nobody-1", 0, 4) == b"mine"         # root reads anything
        assert c.info("shared")["uid"] == 0
        assert c.read("shared", 0, 17) == b"nobody wrote this"
        assert c.info("stickydir/rootfile")["uid"] == 0
        assert [e["name"] for e in c.ls("opendir")] == ["nobody"]
        names = sorted(e["name"] for e in c.ls(""))
        assert names == ["nobody-1", "nobody-2", "nobodydir", "opendir", "shared", "stickydir"]
        # root may remove nobody's allocation in the sticky root
        assert c.remove("nobody-1") == ["nobody-1"]


# ---- directories -----------------------------------------------------------------------------

def _probe_dirs(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {}
    res["ls_private"] = attempt(c.ls, "private")
    res["ls_private_file"] = attempt(c.ls, "private/a")
    res["info_private"] = attempt(lambda: c.info("private")["mode"])
    res["info_private_file"] = attempt(c.info, "private/a")
    res["read_private_file"] = attempt(c.read, "private/a")
    res["create_in_private"] = attempt(c.create, "private/x", 4096)
    res["create_deep_in_private"] = attempt(c.create, "private/sub/x", 4096)
    res["mkdir_in_private"] = attempt(c.mkdir, "private/sub")
    res["rm_private_file"] = attempt(c.remove, "private/a")
    res["rm_private"] = attempt(c.remove, "private", recursive=True)
    res["ls_root_recursive"] = attempt(lambda: sorted(e["path"] for e in c.ls("",
                                                                          recursive=True)))
    # 0711: search without read: names can be used but not listed
    res["ls_search"] = attempt(c.ls, "searchonly")
    res["read_search_file"] = attempt(c.read, "searchonly/pub", 0, 5)
    res["create_in_search"] = attempt(c.create, "searchonly/x", 4096)
    # 0755: listable and readable, not writable
    res["ls_open"] = attempt(lambda: [e["name"] for e in c.ls("public")])
    res["create_in_open"] = attempt(c.create, "public/x", 4096)
    res["rm_in_open"] = attempt(c.remove, "public/pub")
    c.close()
    return res


def test_private_directory_is_closed_to_another_uid(daemon):
    with daemon.client() as c:
        c.mkdir("private", mode=0o700)
        c.create("private/a", 4096, mode=0o644)
        c.write("private/a", b"inner")
        c.mkdir("searchonly", mode=0o711)
        c.create("searchonly/pub", 4096, mode=0o644)
        c.write("searchonly/pub", b"hello")
        c.mkdir("public", mode=0o755)
        c.create("public/pub", 4096, mode=0o644)
        before = snapshot(c, "private/a")

    res = run_as(_probe_dirs, daemon.socket)

    assert_denied(res["ls_private"], "list")
    assert res["info_private"] == {"value": "0700"}      # stat of the directory itself
    # everything inside needs search on 'private', even though 'a' itself is 0644
    for key in ("ls_private_file", "info_private_file", "read_private_file", "rm_private_file",
                "create_deep_in_private"):
        assert_denied(res[key], "search")
    # a new entry directly in it needs w+x on it
    for key in ("create_in_private", "mkdir_in_private"):
        assert_denied(res[key], "create")
    assert_denied(res["rm_private"])
    # a recursive listing of the root shows 'private' but skips its contents
    listed = res["ls_root_recursive"]["value"]
    assert "private" in listed and "private/a" not in listed
    assert "searchonly/pub" not in listed and "public/pub" in listed

    assert_denied(res["ls_search"], "list")
    assert bytes.fromhex(res["read_search_file"]["value"]["bytes"]) == b"hello"
    assert_denied(res["create_in_search"], "create")

    assert res["ls_open"] == {"value": ["pub"]}
    assert_denied(res["create_in_open"], "create")
    assert_denied(res["rm_in_open"], "remove")

    with daemon.client() as c:
        assert [e["name"] for e in c.ls("private")] == ["a"]
        assert c.info("private")["uid"] == 0
        assert snapshot(c, "private/a") == before
        assert [e["name"] for e in c.ls("searchonly")] == ["pub"]
        assert [e["name"] for e in c.ls("public")] == ["pub"]


# ---- group class -----------------------------------------------------------------------------

def _probe_groups(sock: str) -> dict:
    c = Client(sock, timeout=20)
    res = {"groups": sorted(os.getgroups())}
    res["read_0640"] = attempt(c.read, "g0640", 0, 2)
    res["write_0640"] = attempt(c.write, "g0640", b"x")
    res["read_0604"] = attempt(c.read, "g0604", 0, 2)
    res["read_0660_write"] = attempt(c.write, "g0660", b"gw")
    c.close()
    return res


def test_group_bits_come_from_supplementary_groups(daemon):
    """The gid is root's (0). A member of group 0 through its supplementary groups gets the
    group class: 0640 readable, 0660 writable, and 0604 *not* readable (the group class
    applies, with no read bit, even though 'other' has one)."""
    with daemon.client() as c:
        for name, mode in (("g0640", 0o640), ("g0604", 0o604), ("g0660", 0o660)):
            c.create(name, 4096, mode=mode)
            c.write(name, b"ok")

    member = run_as(_probe_groups, daemon.socket, groups=[0])
    assert member["groups"] == [0]
    assert bytes.fromhex(member["read_0640"]["value"]["bytes"]) == b"ok"
    assert_denied(member["write_0640"])
    assert_denied(member["read_0604"], "read")
    assert member["read_0660_write"] == {"value": None}

    stranger = run_as(_probe_groups, daemon.socket)          # no groups: the other class
    assert stranger["groups"] == []
    assert_denied(stranger["read_0640"], "read")
    assert bytes.fromhex(stranger["read_0604"]["value"]["bytes"]) == b"ok"
    assert_denied(stranger["read_0660_write"])

    with daemon.client() as c:
        assert c.read("g0660", 0, 2) == b"gw"
        assert c.read("g0640", 0, 2) == b"ok"


# ---- --mode on the CLI -----------------------------------------------------------------------

def test_cli_mode_option(daemon):
    daemon.cli("create", "x", "--size", "1M", "--mode", "0640", check=True)
    assert daemon.cli_json("info", "x")["mode"] == "0640"
    daemon.cli("create", "y", "--size", "1M", "--mode", "644", check=True)
    assert daemon.cli_json("info", "y")["mode"] == "0644"
    assert daemon.cli_json("info", "y")["uid"] == 0
    daemon.cli("create", "z", "--size", "1M", check=True)
    assert daemon.cli_json("info", "z")["mode"] == "0600"              # the default
    for bad in ("999", "abc", "17777", "-1", "", "rw-r--r--", "0x1a4"):
        proc = daemon.cli("create", "bad", "--size", "1M", "--mode", bad, check=2)
        err = proc.stderr.decode()
        assert "mode" in err and "Traceback" not in err, (bad, err)
        assert err.count("\n") == 1, err
        daemon.cli("info", "bad", check=4)                               # nothing created
    assert sorted(e["name"] for e in daemon.cli_json("ls")) == ["x", "y", "z"]


def _probe_events(sock: str) -> dict:
    with Client(sock) as c:
        c.create("mine", MiB)
        return {"paths": sorted({e["path"] for e in c.events(limit=1000) if e["path"]}),
                "denied": attempt(c.check, repair=True)}


def test_event_log_shows_another_uid_only_its_own_events(daemon):
    daemon.cli("mkdir", "--mode", "0700", "secret", check=True)
    daemon.cli("create", "secret/plans", "--size", "1M", check=True)
    outcome = run_as(_probe_events, daemon.socket)
    assert outcome["paths"] == ["mine"]                    # nothing of root's leaks
    assert_denied(outcome["denied"])                        # check --repair is root's
    assert "secret/plans" in {e["path"] for e in daemon.cli_json("events")}
