"""`gpumemctl save` run by root against paths and metadata other users control (issue 24,
items 1-3). Before: the index file's name came from metadata any writer of the directory
sets, joined to OUT (an absolute name replaced root's 0600 file); the temporary file was
`OUT.gpumemctl-PID.tmp`, opened following links (a symlink planted for each likely pid in a
1777 directory overwrote root's file); and OUT was replaced whatever it was (a device node
became a regular file, a FIFO and a symlink were replaced, `-` made a file named `-`).

What holds now (docs/tensors.md, "save"; gpumemctl/localfiles.py): names from the daemon are
checked to be file names under OUT, refused before anything is written; temporaries are
O_CREAT|O_EXCL|O_NOFOLLOW under random names; OUT is written only if it is a regular file or
a new name, every other kind refused with one line (exit 2) and left as it was; directories
below OUT are opened by fd without following links; `-` is stdout."""
from __future__ import annotations

import contextlib
import json
import mmap  # noqa: F401 - Client.write maps memory in the child, which cannot import it
import os
import socket
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import gpumemctl.memory  # noqa: F401 - as mmap
from gpumemctl import Client
from tests.harness import child_env, fill_filesystem, script_argv
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
SECRET = b"root's secret\n"
USAGE, NO_SPACE = 2, 7


# ---- the scene ------------------------------------------------------------------------------
def secret_file(path: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, SECRET)
    os.close(fd)
    return path


def assert_untouched(secret: str) -> None:
    st = os.stat(secret, follow_symlinks=False)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    with open(secret, "rb") as f:
        assert f.read() == SECRET


def tiny_file(path: str) -> bytes:
    save_file({"w": np.arange(64, dtype=np.float32)}, path, metadata={"by": "test"})
    with open(path, "rb") as f:
        return f.read()


def split(raw: bytes) -> tuple[str, bytes]:
    n = int.from_bytes(raw[:8], "little")
    return raw[8:8 + n].decode(), raw[8 + n:]


def scene(daemon) -> Path:
    """A directory 65534 can reach (tmp_path is under root's 0700 pytest directory)."""
    path = Path(daemon.base) / "scene"
    path.mkdir(mode=0o755)
    return path


def nobodys_dir(path: str, mode: int = 0o755) -> str:
    os.mkdir(path)
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, mode)
    return path


def _make_model(sock: str, header: str, data_hex: str, shards: list[str],
                index_name: str | None) -> str:
    """As 65534: a directory `evil` of shards (each a loaded safetensors file) with an
    index, its name set to whatever the attacker likes."""
    data = bytes.fromhex(data_hex)
    c = Client(sock, timeout=30)
    c.mkdir("evil", mode=0o755)
    for shard in shards:
        if "/" in shard:
            c.mkdir("evil/" + shard.rpartition("/")[0], mode=0o755, parents=True)
        c.create(f"evil/{shard}", len(data), mode=0o644, metadata={"safetensors": header})
        c.write(f"evil/{shard}", data)
    c.meta_set("evil", "safetensors.index", json.dumps(
        {"weight_map": {"w": shards[0]}}))
    if index_name is not None:
        c.meta_set("evil", "safetensors.index.name", index_name)
    c.close()
    return "made"


def attackers_model(daemon, base: Path, shards=("w.safetensors",), index_name=None) -> bytes:
    raw = tiny_file(str(base / "tiny.safetensors"))
    header, data = split(raw)
    assert run_as(_make_model, daemon.socket, header, data.hex(), list(shards),
                  index_name) == "made"
    return raw


def one_line(proc) -> str:
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- item 1: the index file's name is data ---------------------------------------------------
@pytest.mark.parametrize("bad", ["ABSOLUTE", "../secret", "sub/x.json", "..", ".", "x.txt",
                                 "w.safetensors", "a" * 300 + ".json", "nul\0.json"],
                         ids=["absolute", "dotdot", "nested", "parent", "self", "not-json",
                              "a-shard", "too-long", "nul"])
def test_an_index_name_from_metadata_never_leaves_out(daemon, bad):
    base = scene(daemon)
    secret = secret_file(str(base / "secret"))
    value = secret if bad == "ABSOLUTE" else bad
    attackers_model(daemon, base, index_name=value)
    out = base / "out"
    proc = daemon.cli("save", "evil", str(out))
    assert proc.returncode == USAGE, proc.stderr
    err = one_line(proc)
    assert "safetensors.index.name" in err and value.split("\0")[0][:60] in err, err
    assert_untouched(secret)
    assert not out.exists()                     # refused before anything was written


def test_a_plain_index_name_is_kept(daemon):
    base = scene(daemon)
    attackers_model(daemon, base, index_name="custom.safetensors.index.json")
    out = base / "out"
    daemon.cli("save", "evil", str(out), check=True)
    assert sorted(os.listdir(out)) == ["custom.safetensors.index.json", "w.safetensors"]


def test_the_item_1_attack_end_to_end(daemon):
    """The issue's steps: 65534 loads a model into `evil` and points its index name at root's
    0600 file; root's `gpumemctl save evil OUT` exits 2 and the file keeps its bytes."""
    base = scene(daemon)
    secret = secret_file(str(base / "anything"))
    attackers_model(daemon, base, index_name=secret)
    proc = daemon.cli("save", "evil", str(base / "OUT"))
    assert proc.returncode == USAGE
    assert secret in one_line(proc)
    assert_untouched(secret)


# ---- shards below OUT: never through a link ----------------------------------------------------
def _plant(links: list) -> int:
    for target, name in links:
        os.symlink(target, name)
    return len(links)


def test_a_link_planted_for_a_nested_shard_directory_is_not_followed(daemon):
    base = scene(daemon)
    victim = base / "victim"
    victim.mkdir(mode=0o700)
    secret = secret_file(str(victim / "secret"))
    attackers_model(daemon, base, shards=["sub/w.safetensors"])
    out = nobodys_dir(str(base / "out"))            # a directory 65534 can write
    run_as(_plant, [(str(victim), os.path.join(out, "sub"))])
    proc = daemon.cli("save", "evil", out)
    assert proc.returncode == USAGE
    assert "sub is a symbolic link" in one_line(proc)
    assert os.listdir(victim) == ["secret"]
    assert_untouched(secret)
    assert os.path.islink(os.path.join(out, "sub"))


def test_a_link_planted_at_a_shard_file_is_refused_not_replaced(daemon):
    base = scene(daemon)
    secret = secret_file(str(base / "secret"))
    attackers_model(daemon, base)
    out = nobodys_dir(str(base / "out"))
    run_as(_plant, [(secret, os.path.join(out, "w.safetensors"))])
    proc = daemon.cli("save", "evil", out)
    assert proc.returncode == USAGE
    assert "symbolic link; name its target" in one_line(proc)
    assert os.readlink(os.path.join(out, "w.safetensors")) == secret
    assert_untouched(secret)


def test_nested_shards_save_into_real_directories(daemon):
    base = scene(daemon)
    raw = attackers_model(daemon, base, shards=["a/b/w.safetensors", "x.safetensors"])
    out = base / "out"
    daemon.cli("save", "evil", str(out), check=True)
    assert (out / "a" / "b" / "w.safetensors").read_bytes() == raw
    assert (out / "x.safetensors").read_bytes() == raw
    assert (out / "model.safetensors.index.json").exists()


# ---- item 2: the temporary file ---------------------------------------------------------------
def test_links_planted_at_every_likely_temporary_name_are_not_followed(daemon):
    """65534 plants OUT.gpumemctl-PID.tmp -> root's file for the next 4000 pids in a 1777
    directory (the old temporary name); the new ones are random and made O_EXCL|O_NOFOLLOW."""
    base = scene(daemon)
    secret = secret_file(str(base / "secret"))
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    raw = tiny_file(str(base / "tiny.safetensors"))
    daemon.cli("load", str(base / "tiny.safetensors"), "m", check=True)
    out = str(shared / "out.safetensors")
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last = int(f.read())
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    pids = [(last + i) % pid_max for i in range(1, 4001)]
    assert run_as(_plant, [(secret, f"{out}.gpumemctl-{p}.tmp") for p in pids]) == 4000
    daemon.cli("save", "m", out, check=True)
    assert_untouched(secret)
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
    assert open(out, "rb").read() == raw
    left = [n for n in os.listdir(shared) if n != "out.safetensors"]
    assert len(left) == 4000 and all(os.path.islink(shared / n) for n in left)


# ---- item 3: what OUT is ------------------------------------------------------------------------
@contextlib.contextmanager
def special(kind: str, path: str, secret: str):
    """An OUT of `kind` at `path`; yields a check that it is still that."""
    sock = None
    if kind == "character device":           # a twin of /dev/full: the real one is not risked
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("mknod is not permitted here")
        test = stat.S_ISCHR
    elif kind == "FIFO":
        os.mkfifo(path)
        test = stat.S_ISFIFO
    elif kind == "symbolic link":
        os.symlink(secret, path)
        test = stat.S_ISLNK
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        test = stat.S_ISSOCK
    else:
        os.mkdir(path)
        test = stat.S_ISDIR
    try:
        yield lambda: test(os.lstat(path).st_mode)
    finally:
        if sock is not None:
            sock.close()


@pytest.mark.parametrize("kind", ["character device", "FIFO", "symbolic link", "socket",
                                  "directory"])
def test_an_out_that_is_not_a_regular_file_is_refused_and_kept(daemon, kind):
    base = scene(daemon)
    secret = secret_file(str(base / "secret"))
    tiny_file(str(base / "tiny.safetensors"))
    daemon.cli("load", str(base / "tiny.safetensors"), "m", check=True)
    out = str(base / "out")
    with special(kind, out, secret) as still:
        proc = daemon.cli("save", "m", out, timeout=30)       # a FIFO must not hang it
        assert proc.returncode == USAGE, proc.stderr
        err = one_line(proc)
        assert out in err and kind in err, err
        if kind == "symbolic link":
            assert "name its target" in err
        assert still()
    assert_untouched(secret)
    assert [n for n in os.listdir(base) if n.startswith(".gpumemctl-")] == []


def test_a_directory_out_that_is_a_link_or_a_file_is_refused(daemon):
    base = scene(daemon)
    attackers_model(daemon, base)
    real = base / "real"
    real.mkdir()
    os.symlink(real, base / "link")
    proc = daemon.cli("save", "evil", str(base / "link"))
    assert proc.returncode == USAGE and "symbolic link" in one_line(proc)
    assert os.listdir(real) == []
    (base / "file").write_bytes(b"kept")
    proc = daemon.cli("save", "evil", str(base / "file"))
    assert proc.returncode == USAGE and "not a directory" in one_line(proc)
    assert (base / "file").read_bytes() == b"kept"


def test_dash_is_stdout_and_makes_no_file(daemon):
    base = scene(daemon)
    raw = tiny_file(str(base / "tiny.safetensors"))
    daemon.cli("load", str(base / "tiny.safetensors"), "m", check=True)
    work = base / "cwd"
    work.mkdir()
    proc = subprocess.run(script_argv("gpumemctl") + ["--socket", daemon.socket, "save", "m",
                                                       "-"],
                          capture_output=True, env=child_env(), cwd=work, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == raw                    # the file's bytes alone: data on stdout
    assert proc.stderr.decode().startswith("saved m to ")   # the summary on stderr (issue 27)
    assert os.listdir(work) == []
    assert daemon.cli("save", "m", "-", "--json").returncode == USAGE
    attackers_model(daemon, base)
    proc = daemon.cli("save", "evil", "-")
    assert proc.returncode == USAGE and "directory" in one_line(proc)


def test_a_regular_out_is_replaced_whole_or_not_at_all(daemon):
    """Replaced by rename (a new inode, no temporary left); on a full disk exit 7 naming OUT,
    the old file as it was and no temporary left."""
    base = scene(daemon)
    raw = tiny_file(str(base / "tiny.safetensors"))
    daemon.cli("load", str(base / "tiny.safetensors"), "m", check=True)
    out = base / "out.safetensors"
    out.write_bytes(b"old")
    before = os.stat(out).st_ino
    daemon.cli("save", "m", str(out), check=True)
    assert out.read_bytes() == raw and os.stat(out).st_ino != before
    assert not [n for n in os.listdir(base) if n.endswith(".tmp")]

    disk = base / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        daemon.cli("create", "big", "--size", "1M", check=True)
        with Client(daemon.socket) as c:
            c.meta_set("big", "safetensors", json.dumps(
                {"b": {"dtype": "U8", "shape": [1 << 20], "data_offsets": [0, 1 << 20]}}))
        (disk / "out.safetensors").write_bytes(b"old")
        fill_filesystem(str(disk))
        proc = daemon.cli("save", "big", str(disk / "out.safetensors"))
        assert proc.returncode == NO_SPACE, proc.stderr
        assert "No space left on device" in one_line(proc)
        assert (disk / "out.safetensors").read_bytes() == b"old"
        assert sorted(os.listdir(disk)) == ["filler", "out.safetensors"]
    finally:
        subprocess.run(["umount", "-l", str(disk)])
