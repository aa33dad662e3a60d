"""Helpers for the tests of snapshot stores others can write (issue 24: tests/security/
test_snapshot_stores.py, tests/integration/test_snapshot_selection.py): stores with the
modes a shared store has, allocations filled with known bytes, the memory lost as after a
reboot, the CLI run in a run_as child, and a CLI run whose peak memory is measured.

A run_as child cannot import anything once it is another uid (tests/users.py): the modules
here import what the snapshot commands load lazily, so importing this module is enough.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import xxhash  # noqa: F401 - block checksums, loaded before run_as drops root

import gpumemctl.cli.typerapp  # the typer app, loaded before run_as drops root
import gpumemctl.memory  # noqa: F401 - a handle's mapping, loaded before run_as drops root
from gpumemctl.cli import run as cli_run
from gpumemctl.snapshots import engine  # noqa: F401 - loads every snapshot module
from gpumemctl.snapshots import manifest as fmt
from tests.harness import child_env, is_keeper, script_argv, wait_for

MiB = 1 << 20


def make_store(request, mode: int = 0o700, owner: int | None = None,
               group: int | None = None) -> str:
    """An empty store directory with `mode` (0o1777: a shared one), removed after the
    test."""
    path = tempfile.mkdtemp(prefix="gpumem-snapstore-")
    request.addfinalizer(lambda: shutil.rmtree(path, ignore_errors=True))
    os.chown(path, -1 if owner is None else owner, -1 if group is None else group)
    os.chmod(path, mode)
    return path


def fill(d, specs: dict[str, int], mode: int = 0o600) -> dict[str, bytes]:
    """Durable allocations {path: size} of random bytes, made by the test's uid."""
    data = {}
    with d.client() as c:
        for path, size in specs.items():
            c.create(path, size, durable=True, mode=mode)
            data[path] = os.urandom(size)
            c.write(path, data[path])
    return data


def lose_memory(d) -> None:
    """As after a reboot: the daemon stops, its keeper dies, the daemon starts again."""
    keeper = d.keeper_pid()
    assert d.stop() == 0
    d.kill_keeper()
    wait_for(lambda: keeper is None or not is_keeper(keeper, d.state_dir), 10,
             what="the keeper to die")
    d.start()


def states(d) -> dict[str, str]:
    return {e["path"]: e["state"] for e in d.cli_json("ls", "-R") if e["type"] == "allocation"}


def cli_as(sock: str, *args: str) -> dict:
    """`gpumemctl --socket SOCK ARGS` in this process (a run_as child: the venv's interpreter
    cannot be started by another uid): exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_run(["--socket", sock, *args])
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def read_manifest(store: str, name: str) -> dict:
    with open(os.path.join(store, name, fmt.MANIFEST), "rb") as f:
        return json.loads(f.read())


def write_manifest(store: str, manifest: dict) -> None:
    """Seal and write a manifest into its snapshot's directory (made if missing), as its
    writer would: only the file system says who that was."""
    where = os.path.join(store, manifest["name"])
    os.makedirs(where, mode=0o700, exist_ok=True)
    with open(os.path.join(where, fmt.MANIFEST), "wb") as f:
        f.write(fmt.seal(manifest))


def one_line_error(stderr: bytes | str) -> list[str]:
    """The error and warning lines of stderr (a command's summary goes there too since
    issue 27, as docs/cli.md's "stdout carries data only" says: it is not counted)."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.startswith("gpumemctl: ")]


# Runs argv[2:] and writes its peak RSS (KiB) to argv[1]. Measured in this small parent: a
# child forked (or vforked) from pytest starts with pytest's own high-water mark.
_MEASURE = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[2:]).returncode\n"
            "with open(sys.argv[1], 'w') as f:\n"
            "    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
            "sys.exit(code if code >= 0 else 128 - code)\n")


def cli_measured(d, *args: str, timeout: float = 60) -> dict:
    """`gpumemctl --socket S ARGS` as Daemon.cli runs it, killed after `timeout` seconds:
    exit code (None: it had to be killed), stdout, stderr and its peak resident memory."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = os.path.join(tmp, "peak")
        argv = [sys.executable, "-c", _MEASURE, peak, *script_argv("gpumemctl"),
                "--socket", d.socket, *args]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child_env(),
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return {"code": None, "stdout": out, "stderr": err, "max_rss": None}
        with open(peak) as f:
            max_rss = int(f.read()) * 1024
    return {"code": proc.returncode, "stdout": out, "stderr": err, "max_rss": max_rss}
