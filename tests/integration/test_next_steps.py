"""Errors that name the next step (issue 27, item 1): a client that finds no gpumemd says
how to start one or where one serves; a --socket that is not a socket says so; a user's
gpumemd in a `su` shell (no XDG_RUNTIME_DIR) says what to do; a mount that fails says the
cause `gpumemctl doctor` would find, with its fix."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests.harness import child_env, script_argv
from tests.users import NOBODY, run_as

NOT_RUNNING = 3


def _ctl(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(script_argv("gpumemctl") + ["--socket", sock, *args],
                          capture_output=True, text=True, env=child_env(None), timeout=60)


def _one_line(proc) -> str:
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_no_daemon_names_how_to_start_one(tmp_path):
    proc = _ctl(str(tmp_path / "gpumemd.sock"), "ls")
    assert proc.returncode == NOT_RUNNING
    err = _one_line(proc)
    assert "gpumemd is not running: no socket at" in err
    assert "gpumemd --socket" in err or "systemctl start gpumemd" in err, err
    assert "gpumemctl doctor" in err


def test_a_socket_option_naming_a_regular_file_says_it_is_not_a_socket(tmp_path):
    plain = tmp_path / "not-a-socket"
    plain.write_text("")
    err = _one_line(_ctl(str(plain), "ls"))
    assert f"{plain}: it is a regular file, not a socket" in err


def test_a_stale_socket_is_told_apart_from_a_missing_one(tmp_path):
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)                     # bound, never listening: connect() is refused
    s.close()
    proc = _ctl(path, "status")
    assert proc.returncode == NOT_RUNNING
    assert "left from an earlier run (connection refused)" in _one_line(proc)


def _socket_dir_as_user() -> str:
    from daemon import paths
    os.environ.pop("XDG_RUNTIME_DIR", None)
    try:
        paths.safe_directory("socket directory", f"/run/user/{os.geteuid()}")
    except paths.UnsafePath as exc:
        return str(exc)
    return "made"


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_a_users_daemon_without_xdg_runtime_dir_says_what_to_do():
    """gpumemd's check of its default socket directory, as uid 65534 in a shell without
    XDG_RUNTIME_DIR (a `su` shell): /run/user/65534 cannot be made, and the line says
    why and what to do. (In a forked child of this process: the daemon's own code, as
    gpumemd runs it at start; uid 65534 may not exec this checkout's interpreter.)"""
    if os.path.isdir(f"/run/user/{NOBODY}"):
        pytest.skip(f"/run/user/{NOBODY} exists here: the default socket would work")
    from daemon import paths  # noqa: F401  imported here: the child may not read it
    said = run_as(_socket_dir_as_user)
    assert said.startswith(f"cannot create the socket directory /run/user/{NOBODY}"), said
    assert "XDG_RUNTIME_DIR is not set" in said and "--socket" in said, said


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_a_failed_mount_names_the_cause_doctor_finds(tmp_path):
    pytest.importorskip("pyfuse3")
    from daemon.fs.mount import why_no_mount  # imported here: the child may not read it
    device = tmp_path / "fuse"
    device.write_text("")
    os.chmod(device, 0o600)               # root's, as a /dev/fuse at 0600 is
    os.chmod(tmp_path, 0o755)
    said = run_as(why_no_mount, str(device))
    assert f"{device} cannot be opened by uid {NOBODY}" in said and "chmod 0666" in said
    assert "modprobe fuse" in run_as(why_no_mount, "/nonexistent-gpumemd-test/fuse")



@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"),
                    reason="this machine has an NVIDIA driver")
def test_auto_on_a_machine_without_a_gpu_says_so_in_a_few_words(daemon_factory):
    """`make run` on a machine without a GPU (issue 27, item 10): the start-up line says
    why the host backend serves in a few words, not the CUDA loader's paragraph."""
    d = daemon_factory(backend="auto")
    line = next(ln for ln in d.log().splitlines() if "backend host chosen" in ln)
    assert line.endswith("backend host chosen (auto: no NVIDIA driver on this machine)"), line
