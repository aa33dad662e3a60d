"""Local files and stdout in every command (issue 24, items 19 and 20): before, `read NAME
/nonexistent/dir/x` and `read NAME > /dev/full` printed tracebacks, `save` made missing
directories and `load` of a file with a 90 MB header exited 3 ("gpumemd closed the
connection") leaving the directory it had made.

What holds now (docs/cli.md, "Local files"): one line naming the path (or stdout) and the
errno's words; exit 4 for a missing file or directory, 6 permission denied, 7 no space, 2
anything else; a reader that went away (EPIPE) ends the command quietly with exit 0; nothing
more on stderr, not even at interpreter exit. A header too large to keep as metadata is
exit 2 naming the file, its size and the limit, and nothing is left."""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

# What the CLI imports as it runs (typer, safetensors...), imported here: the child that runs
# it as 65534 cannot read the interpreter's library under /root (tests/users.py).
import gpumemctl.cli
import gpumemctl.cli.typerapp
import gpumemctl.cli.weights
import gpumemctl.memory
import gpumemctl.weights
from tests.harness import child_env, script_argv
from tests.users import NOBODY, run_as

USAGE, NOT_FOUND, PERMISSION, NO_SPACE = 2, 4, 6, 7
FULL = "No space left on device"


def tiny(path) -> str:
    save_file({"w": np.arange(1 << 16, dtype=np.float32)}, str(path))
    return str(path)


@pytest.fixture
def loaded(daemon, tmp_path):
    """A daemon holding `m` (a loaded safetensors file, readable by all) and `d` (a directory
    of one), and the file itself."""
    src = tiny(tmp_path / "tiny.safetensors")
    daemon.cli("load", src, "m", "--mode", "0644", check=True)
    daemon.cli("mkdir", "d", check=True)
    daemon.cli("load", src, "d/w.safetensors", "--mode", "0644", check=True)
    return daemon, src


def run_cli(d, *args: str, stdout=subprocess.PIPE, stdin=None, timeout: float = 60):
    return subprocess.run(script_argv("gpumemctl") + ["--socket", d.socket, *args],
                          stdout=stdout, stderr=subprocess.PIPE, stdin=stdin,
                          env=child_env(), timeout=timeout)


def one_line(proc, *words: str) -> str:
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("gpumemctl: error: "), err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    for w in words:
        assert w in err, (w, err)
    return err


# ---- a missing directory --------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["read", "m", "{missing}/x"], ["write", "m", "{missing}/x"],
    ["load", "{missing}/x.safetensors", "n"], ["save", "m", "{missing}/x.safetensors"],
    ["save", "d", "{missing}/out"],
], ids=lambda a: a[0] + ("-dir" if a[1] == "d" else ""))
def test_a_missing_directory_is_exit_4_naming_the_path(loaded, tmp_path, argv):
    d, _ = loaded
    missing = str(tmp_path / "nonexistent" / "dir")
    args = [a.format(missing=missing) for a in argv]
    proc = run_cli(d, *args)
    assert proc.returncode == NOT_FOUND, proc.stderr
    one_line(proc, f"{missing}/", "No such file or directory")
    assert not os.path.exists(tmp_path / "nonexistent")      # save made no directory
    assert sorted(e["path"] for e in d.cli_json("ls", "-R")) == ["d", "d/w.safetensors", "m"]


# ---- a full device --------------------------------------------------------------------------
STDOUT_COMMANDS = [["ls"], ["ls", "--json"], ["ls", "-l"], ["info", "m"], ["status"],
                   ["read", "m"], ["read", "m", "-"], ["save", "m", "-"], ["events"],
                   ["meta", "get", "m", "safetensors"], ["metrics"], ["scrub", "status"],
                   ["devices"], ["--version"]]


@pytest.mark.parametrize("argv", STDOUT_COMMANDS, ids=" ".join)
def test_stdout_on_a_full_device_is_exit_7_in_one_line(loaded, argv):
    d, _ = loaded
    with open("/dev/full", "wb") as full:
        proc = run_cli(d, *argv, stdout=full)
    assert proc.returncode == NO_SPACE, proc.stderr
    one_line(proc, f"cannot write to stdout: {FULL}")


def test_a_full_device_as_file(loaded):
    d, _ = loaded
    proc = run_cli(d, "read", "m", "/dev/full")
    assert proc.returncode == NO_SPACE
    one_line(proc, "/dev/full", FULL)
    proc = run_cli(d, "save", "m", "/dev/full")          # not a regular file: refused
    assert proc.returncode == USAGE
    one_line(proc, "/dev/full is a character device")
    proc = run_cli(d, "load", "/dev/full", "n")
    assert proc.returncode == USAGE
    one_line(proc, "/dev/full", "not a regular file")


# ---- a reader that went away -----------------------------------------------------------------
@pytest.mark.parametrize("argv", [["ls"], ["ls", "--json"], ["read", "m"], ["save", "m", "-"],
                                  ["meta", "get", "m", "safetensors"], ["scrub", "status"],
                                  ["info", "m"], ["--version"]], ids=" ".join)
def test_a_closed_pipe_ends_quietly(loaded, argv):
    d, _ = loaded
    r, w = os.pipe()
    os.close(r)                                     # `| head -0`: nobody will read
    try:
        proc = run_cli(d, *argv, stdout=w)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (0, b""), proc.stderr


def test_no_stdout_at_all_is_one_line(loaded):
    """`gpumemctl ls >&-`: fd 1 closed."""
    d, _ = loaded
    proc = subprocess.run(script_argv("gpumemctl") + ["--socket", d.socket, "ls"],
                          stderr=subprocess.PIPE, env=child_env(), timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == USAGE
    one_line(proc, "cannot write to stdout")


# ---- an unreadable (or unwritable) file, as 65534 --------------------------------------------
def _cli(argv: list[str], out: str, err: str) -> int:
    """gpumemctl's main, in this (forked, 65534) process: the venv's interpreter under /root
    cannot be started by 65534, so the CLI runs from what the parent imported."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    code = gpumemctl.cli.run(argv)
    sys.stdout.flush()
    return code


def as_nobody(d, base: str, *argv: str) -> tuple[int, str]:
    out, err = os.path.join(base, "out.txt"), os.path.join(base, "err.txt")
    for path in (out, err):
        open(path, "wb").close()
        os.chown(path, NOBODY, NOBODY)
    code = run_as(_cli, ["--socket", d.socket, *argv], out, err)
    with open(err) as f:
        return code, f.read()


def test_unreadable_and_unwritable_files_are_exit_6(loaded):
    d, src = loaded
    base = os.path.join(d.base, "scene")
    os.mkdir(base, 0o755)
    closed = os.path.join(base, "closed.safetensors")        # root's, mode 000
    with open(src, "rb") as f, open(closed, "wb") as g:
        g.write(f.read())
    os.chmod(closed, 0o000)
    private = os.path.join(base, "private")                  # root's 0755: 65534 cannot write
    os.mkdir(private, 0o755)
    cases = {("write", "m", closed): f"cannot read {closed}: Permission denied",
             ("load", closed, "n"): f"cannot read {closed}: Permission denied",
             ("read", "m", closed): f"cannot write {closed}: Permission denied",
             ("save", "m", f"{private}/m.safetensors"): "Permission denied",
             ("save", "d", f"{private}/out"): "Permission denied"}
    for argv, words in cases.items():
        code, err = as_nobody(d, base, *argv)
        assert code == PERMISSION, (argv, err)
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, (argv, err)
    assert os.listdir(private) == []
    assert [e["path"] for e in d.cli_json("ls")] == ["d", "m"]


# ---- item 20: a header too large for metadata -------------------------------------------------
def padded(path, pad: int, quotes: bool = False) -> str:
    """A valid safetensors file whose header is padded (with spaces, which the format allows
    at the end; or with a __metadata__ value full of characters JSON escapes)."""
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    if quotes:
        header["__metadata__"] = {"q": '"' * pad}
    raw = json.dumps(header).encode() + (b"" if quotes else b" " * pad)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(16))
    return str(path)


def test_a_90_mb_header_is_refused_before_anything_is_made(daemon, tmp_path):
    big = padded(tmp_path / "big.safetensors", 90_000_000)
    size = os.path.getsize(big) - 8 - 16
    proc = daemon.cli("load", big, "models/big/w")
    assert proc.returncode == USAGE, proc.stderr
    one_line(proc, big, f"header is {size} bytes", "1048576")
    assert daemon.cli_json("ls", "-R") == []


@pytest.mark.parametrize("pad, quotes, words", [
    (600_000, False, "metadata_max_bytes"),             # the daemon's bound (512K)
    (350_000, True, "request would be"),    # 700K of \" in the file, past 1 MiB escaped again
], ids=["over-metadata-max", "over-one-request"])
def test_a_header_the_daemon_cannot_keep_leaves_nothing(daemon, tmp_path, pad, quotes, words):
    src = tmp_path / "src"
    src.mkdir()
    tiny(src / "a.safetensors")
    padded(src / "b.safetensors", pad, quotes)
    proc = daemon.cli("load", str(src), "models/two")
    assert proc.returncode == USAGE, proc.stderr
    one_line(proc, str(src / "b.safetensors"), words)
    assert daemon.cli_json("ls", "-R") == []
    assert daemon.cli_json("status")["totals"]["allocations"] == 0
