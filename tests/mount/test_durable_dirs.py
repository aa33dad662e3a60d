"""Directories with a durable default on the mount (issue 27, item 3): `setfattr -n
user.gpu.durable -v true DIR` makes what is created in DIR from then on durable, files and
subdirectories (which carry the default on), so a tree copied into it survives a kill -9 of
the daemon byte for byte, where one copied into an unmarked directory is gone as before.
Only the directory's owner or root may set or clear it (EPERM, as chmod); another user who
may write in the directory makes durable files there, charged to them like any other."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess

import pytest

from tests.harness import wait_for
from tests.users import NOBODY, run_as

from .posix import MiB, expect_errno

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


def make_tree(root: str) -> dict[str, bytes]:
    """A small tree of files of several sizes (empty, a slot, a granule and more) and
    nested directories, outside the mount; {relative path: bytes}."""
    files = {"README": b"hello\n", "empty": b"", "src/main.py": os.urandom(3000),
             "src/lib/deep/x.bin": os.urandom(70 * 1024), ".git/objects/ab/cdef": os.urandom(5),
             ".git/pack/big.pack": os.urandom(3 * MiB + 123), ".git/HEAD": b"ref: main\n"}
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return files


def wait_released(paths) -> None:
    """close(2) does not wait for the kernel's release, which commits the size: wait until
    the daemon has had each (only the durable pin holds it)."""
    for path in paths:
        wait_for(lambda p=path: os.getxattr(p, "user.gpu.refcount") == b"1",
                 what=f"the release of {path}")


def test_a_tree_copied_into_a_durable_directory_survives_kill9(mounted, tmp_path):
    src = str(tmp_path / "repo")
    files = make_tree(src)
    kept, plain = os.path.join(mounted.mnt, "kept"), os.path.join(mounted.mnt, "plain")
    os.mkdir(kept)
    os.mkdir(plain)
    if shutil.which("setfattr"):              # as a user types it
        subprocess.run(["setfattr", "-n", "user.gpu.durable", "-v", "true", kept], check=True)
    else:
        os.setxattr(kept, "user.gpu.durable", b"true")
    assert os.getxattr(kept, "user.gpu.durable") == b"true"
    assert os.getxattr(plain, "user.gpu.durable") == b"false"
    assert mounted.cli_json("info", "kept")["durable"] is True
    assert mounted.cli_json("info", "plain")["durable"] is False
    subprocess.run(["cp", "-r", src, os.path.join(kept, "repo")], check=True)
    subprocess.run(["cp", "-r", src, os.path.join(plain, "repo")], check=True)
    copied = [os.path.join(kept, "repo", rel) for rel in files]
    for path in copied:
        assert os.getxattr(path, "user.gpu.durable") == b"true", path
    assert os.getxattr(os.path.join(kept, "repo", "src", "lib"), "user.gpu.durable") == b"true"
    wait_released(copied)
    mounted.kill9()
    mounted.start()
    for rel, data in files.items():
        with open(os.path.join(kept, "repo", rel), "rb") as f:
            assert f.read() == data, rel
    assert mounted.cli_json("info", "kept/repo/src")["durable"] is True     # the default too
    assert not any(os.path.exists(os.path.join(plain, "repo", rel)) for rel in files)
    assert json.loads(mounted.cli("check", "--json", check=True).stdout)["clean"]


def test_the_default_is_cleared_and_changes_no_existing_file(mounted):
    d = os.path.join(mounted.mnt, "d")
    os.mkdir(d)
    old = os.path.join(d, "old")
    with open(old, "wb") as f:
        f.write(b"x")
    os.setxattr(d, "user.gpu.durable", b"yes")
    assert os.getxattr(old, "user.gpu.durable") == b"false"      # only new ones
    new = os.path.join(d, "new")
    os.close(os.open(new, os.O_CREAT | os.O_WRONLY))
    assert os.getxattr(new, "user.gpu.durable") == b"true"
    os.rename(old, os.path.join(d, "moved"))                      # a rename changes nothing
    assert os.getxattr(os.path.join(d, "moved"), "user.gpu.durable") == b"false"
    os.removexattr(d, "user.gpu.durable")                          # = false
    assert os.getxattr(d, "user.gpu.durable") == b"false"
    os.close(os.open(os.path.join(d, "later"), os.O_CREAT | os.O_WRONLY))
    assert os.getxattr(os.path.join(d, "later"), "user.gpu.durable") == b"false"
    assert os.getxattr(new, "user.gpu.durable") == b"true"
    expect_errno(errno.EINVAL, os.setxattr, d, "user.gpu.durable", b"maybe")
    expect_errno(errno.ENODATA, os.getxattr, d, "user.gpu.size")
    assert os.listxattr(d) == []


@needs_root
def test_another_uid_cannot_set_the_default_but_makes_durable_files_charged_to_it(
        mounted_factory, tmp_path):
    config = tmp_path / "gpumemd.toml"
    config.write_text(f'[quotas]\n{NOBODY} = "4M"\n')
    d = mounted_factory(extra_args=["--config", str(config)])
    shared = os.path.join(d.mnt, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)                    # nobody may write in it, root owns it
    os.setxattr(shared, "user.gpu.durable", b"true")

    def as_nobody():
        out = {}
        for verb, value in (("set", b"true"), ("clear", b"false")):
            try:
                os.setxattr(shared, "user.gpu.durable", value)
                out[verb] = "ok"
            except OSError as exc:
                out[verb] = errno.errorcode[exc.errno]
        path = os.path.join(shared, "mine")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        written = 0
        try:
            for _ in range(6):                 # 6 MiB into a 4 MiB quota
                os.write(fd, b"n" * MiB)
                written += 1
        except OSError as exc:
            out["write"] = errno.errorcode[exc.errno]
        finally:
            os.close(fd)
        out["written"] = written
        out["durable"] = os.getxattr(path, "user.gpu.durable").decode()
        return out

    got = run_as(as_nobody)
    assert (got["set"], got["clear"]) == ("EPERM", "EPERM")
    assert got["durable"] == "true" and got["write"] == "EDQUOT" and got["written"] == 4
    assert os.getxattr(shared, "user.gpu.durable") == b"true"
    info = d.cli_json("info", "shared/mine")
    assert (info["uid"], info["durable"]) == (NOBODY, True)
    d.cli("transient", "shared", check=True)   # root may clear it (socket op `durable`)
    assert os.getxattr(shared, "user.gpu.durable") == b"false"
