"""File descriptors as a shared resource (issue 24, item 9). Each allocation holds 2 of the
daemon's descriptors (its memory and its ECC parity) and, durable, 2 of the keeper's. Before:
under a service manager's limit of 1024, uid 65534's small allocations, within its quota,
took every descriptor; the next creates, root's included, exited 70 (`OSError: [Errno 24]`),
accept() failed, and writes on the mount failed with EIO.

What holds now (daemon/core/fdbudget.py, docs/operations.md "File descriptors"): gpumemd raises
its soft limit to the hard one at start, and so does the keeper it starts; descriptors for
allocations are budgeted, each user but root at most max_fd_share_per_uid of them; a create
past it is exit 7 (EDQUOT on the mount) naming the limit; root's create, an existing file's
write and `status` go on; the keeper refuses a deposit past its own limit with exit 7."""
from __future__ import annotations

import errno
import os
import resource

import pytest

from gpumemctl import Client
from gpumemctl.protocol import GpumemError
from tests.harness import wait_for
from tests.users import run_as

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root"),
              pytest.mark.slabs_off]
NO_MEMORY = 7


def _nofile(soft: int, hard: int):
    """A preexec_fn: the daemon starts under this open-file limit (as `prlimit --nofile`)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_file_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) "Max open files" of a process, as /proc/PID/limits shows them."""
    with open(f"/proc/{pid}/limits") as f:
        line = next(ln for ln in f if ln.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


def _create_until_refused(sock: str, mnt: str, most: int) -> dict:
    c = Client(sock)
    c.mkdir("mine")
    made, refused = 0, None
    for i in range(most):
        try:
            c.create(f"mine/a{i}", 4096)
            made += 1
        except GpumemError as exc:
            refused = {"code": exc.code, "message": str(exc)}
            break
    c.close()
    # On the mount, an empty file holds no memory yet: its first write meets the share.
    fd = os.open(f"{mnt}/mine/by-mount", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.write(fd, b"x")
        os.fsync(fd)
        mount_create = "written"
    except OSError as exc:
        mount_create = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    with open(f"{mnt}/mine/a0", "r+b") as f:   # its own existing file: written as ever
        f.write(b"still mine")
    with open(f"{mnt}/mine/a0", "rb") as f:
        own_write = f.read(10).decode()
    return {"made": made, "refused": refused, "mount_create": mount_create,
            "own_write": own_write}


def test_one_user_cannot_take_every_descriptor_under_a_limit_of_1024(mounted_factory):
    # Memory for 1000 small allocations (2M + 2M of parity each): descriptors run out first.
    d = mounted_factory(start=False, extra_args=["--host-capacity", "4G"])
    d.start(preexec_fn=_nofile(1024, 1024))
    existing = os.path.join(d.mnt, "roots-file")
    with open(existing, "wb") as f:
        f.write(b"before")
    res = run_as(_create_until_refused, d.socket, d.mnt, 2000, timeout=300)
    assert res["refused"] is not None, res
    assert res["refused"]["code"] == NO_MEMORY, res
    message = res["refused"]["message"]
    assert "uid 65534 holds" in message and "file descriptors" in message, message
    assert "max_fd_share_per_uid" in message and "open-file limit 1024" in message, message
    assert 50 <= res["made"] < 400, res
    assert res["mount_create"] == "EDQUOT", res
    assert res["own_write"] == "still mine", res
    # Root is not held to the share: its creates, durable too, and its writes go on.
    d.cli("create", "roots-new", "--size", "4K", check=True)
    d.cli("create", "roots-durable", "--size", "4K", "--durable", check=True)
    with open(existing, "r+b") as f:
        f.write(b"after!")
    with open(existing, "rb") as f:
        assert f.read() == b"after!"
    with open(os.path.join(d.mnt, "roots-by-mount"), "wb") as f:
        f.write(b"new")
    assert d.cli_json("status")["daemon"]["pid"] == d.proc.pid
    assert d.client().check()["clean"] is True
    assert "Errno 24" not in d.log() and "rolled back" not in d.log()


def test_the_soft_limit_is_raised_to_the_hard_one_and_the_keeper_inherits_it(daemon_factory):
    d = daemon_factory(start=False)
    d.start(preexec_fn=_nofile(512, 4096))
    assert open_file_limit(d.proc.pid) == (4096, 4096)
    d.cli("create", "kept", "--size", "4K", "--durable", check=True)
    assert open_file_limit(d.keeper_pid()) == (4096, 4096)
    assert "open-file limit 4096 (raised from 512)" in d.log()
    assert d.log().count("open-file limit") == 1


def test_the_keeper_refuses_a_deposit_past_its_own_limit(daemon_factory):
    d = daemon_factory()
    d.cli("create", "first", "--size", "4K", "--durable", check=True)
    keeper = d.keeper_pid()
    in_use = len(os.listdir(f"/proc/{keeper}/fd"))
    hard = resource.prlimit(keeper, resource.RLIMIT_NOFILE)[1]
    # Room for a few more deposits (2 descriptors each) past the 32 the keeper keeps spare.
    resource.prlimit(keeper, resource.RLIMIT_NOFILE, (in_use + 32 + 6, hard))
    made, refused = [], None
    for i in range(40):                  # far past the limit, would nothing refuse
        proc = d.cli("create", f"d{i}", "--size", "4K", "--durable")
        if proc.returncode:
            refused = proc
            break
        made.append(f"d{i}")
    assert refused is not None and refused.returncode == NO_MEMORY, refused
    stderr = refused.stderr.decode()
    assert "the keeper holds" in stderr and "open-file limit" in stderr, stderr
    assert 1 <= len(made) <= 10, made
    d.cli("create", "transient", "--size", "4K", check=True)     # not the keeper's
    marked = d.cli("durable", "transient")                # a durable mark: the keeper's
    assert marked.returncode == NO_MEMORY, marked
    assert "the keeper holds" in marked.stderr.decode()
    assert d.cli_json("info", "transient")["durable"] is False
    assert d.keeper_pid() == keeper and os.path.exists(f"/proc/{keeper}")
    d.kill9()                            # what the keeper holds is all there is after this
    d.start()
    listed = {e["path"]: e["state"] for e in d.cli_json("ls")}
    assert all(listed[name] == "ready" for name in ["first", *made]), listed
    assert f"d{len(made)}" not in listed
    wait_for(lambda: d.client().check()["clean"], timeout=10, what="check clean")
