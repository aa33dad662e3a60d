"""Paths under directories other users control (issue 14). gpumemd runs as root; before, a
--socket, --state-dir or --mount under a directory another user owned let that user make
root act on a name of their choosing: chmod 0666 followed a symlink swapped in after bind
(a root 0600 file became 0666), a non-socket file at the socket path was removed, the lock
file was opened through a planted symlink (a root file truncated and overwritten), the
mount landed on a symlink's target, and the keeper, which knew its socket by inode number
alone, took another filesystem's socket for its own.

What holds now (docs/security.md, daemon/paths.py): those three directories, and every
directory and symlink above them, are root's or the daemon's uid's and writable by nobody
else (a root-owned sticky parent such as /tmp is fine); otherwise gpumemd refuses to start
with one line naming the path and why. Its own files are made with O_EXCL|O_NOFOLLOW; the
socket is chmod'ed before it has its name; only a socket is removed as stale; the keeper
knows its socket by device and inode."""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import stat
import subprocess
import threading
import time

import pytest
import trio

from daemon.paths import UnsafePath, safe_directory
from daemon.server.transport import ConnectionLimits, listen
from tests.harness import PYTHON, ROOT, child_env, fuse_missing, is_mounted, wait_for
from tests.users import NOBODY, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
SECRET = b"root's secret\n"


# ---- the scene: a root file worth attacking, a directory another user owns ------------------
def secret_file(base: str) -> str:
    path = os.path.join(base, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, SECRET)
    os.close(fd)
    return path


def assert_untouched(secret: str) -> None:
    st = os.stat(secret)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0, oct(st.st_mode)
    with open(secret, "rb") as f:
        assert f.read() == SECRET


def nobodys_dir(path: str, mode: int = 0o755) -> str:
    os.mkdir(path, mode)
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, mode)
    return path


def _plant(links: list) -> None:
    for target, name in links:
        os.symlink(target, name)


def plant_as_nobody(*links: tuple[str, str]) -> None:
    """The attacker's symlinks, each (target, name), made by uid 65534."""
    run_as(_plant, list(links))


def refusal(d, timeout: float = 30) -> str:
    """Start `d`, which must refuse: exit 1, serving nothing, starting no keeper. Returns
    its one `gpumemd: ` line."""
    d.start(wait=False)
    assert d.proc.wait(timeout) == 1, d.log()
    lines = [line for line in d.log().splitlines() if line.startswith("gpumemd: ")]
    assert len(lines) == 1, d.log()
    assert d.keeper_pid() is None
    return lines[0]


# ---- --socket ------------------------------------------------------------------------------
def test_a_socket_directory_another_user_owns_is_refused(daemon_factory):
    d = daemon_factory(start=False)
    secret = secret_file(d.base)
    evil = nobodys_dir(os.path.join(d.base, "evil"))
    d.socket = os.path.join(evil, "gpumemd.sock")
    plant_as_nobody((secret, d.socket))
    assert refusal(d) == (f"gpumemd: refusing the socket directory {evil}: it is owned by "
                          "uid 65534, not root")
    assert os.path.islink(d.socket)            # the planted name, neither removed nor used
    assert_untouched(secret)


def _swap_in_symlinks(path: str, secret: str, stop: threading.Event) -> None:
    """The attacker's side of the race: each time a socket appears at `path`, put a symlink
    to root's file in its place, hoping that chmod comes after."""
    while not stop.is_set():
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
                os.symlink(secret, path)
        except OSError:
            pass


async def _listen_once(path: str) -> None:
    async def never(conn):           # no client connects
        raise AssertionError

    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(listen, path, never, ConnectionLimits(16, 16)))
        nursery.cancel_scope.cancel()


def test_the_socket_mode_is_set_without_following_a_swapped_symlink(tmp_path):
    """The second defence, under the directory check: the daemon's listen() against a
    thread that swaps a symlink in for each new socket. Before, chmod by path followed it
    within a few hundred tries and root's 0600 file became 0666."""
    secret = secret_file(str(tmp_path))
    path = str(tmp_path / "gpumemd.sock")
    stop = threading.Event()
    swapper = threading.Thread(target=_swap_in_symlinks, args=(path, secret, stop))
    swapper.start()
    tries = swapped = 0
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline and stat.S_IMODE(os.stat(secret).st_mode) == 0o600:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            trio.run(_listen_once, path)
            tries += 1
            swapped += os.path.islink(path)
    finally:
        stop.set()
        swapper.join()
    assert_untouched(secret)
    assert swapped >= 20, f"the swapper got in only {swapped} times of {tries}"
    assert sorted(os.listdir(tmp_path)) == ["gpumemd.sock", "secret"]   # no staging left


def test_a_file_that_is_not_a_socket_is_not_removed(daemon_factory):
    """Before: any file at the socket path that refused a connection was unlinked as a
    stale socket (`--socket /etc/shadow` removed it)."""
    d = daemon_factory(start=False)
    d.socket = secret_file(d.base)
    assert refusal(d) == (f"gpumemd: refusing the socket {d.socket}: it exists and is not a "
                          "socket (gpumemd removes only a stale socket of its own there)")
    assert_untouched(d.socket)


# ---- --state-dir -----------------------------------------------------------------------------
def test_a_state_directory_another_user_owns_is_refused(daemon_factory):
    """Before: used as it was; the lock file opened through the owner's symlink, and root's
    file truncated to gpumemd's pid. The owner could also remove keeper.sock, and the keeper
    exited, freeing durable memory."""
    d = daemon_factory(start=False)
    secret = secret_file(d.base)
    d.state_dir = nobodys_dir(os.path.join(d.base, "state"), 0o700)
    plant_as_nobody((secret, os.path.join(d.state_dir, "gpumemd.lock")),
                    (secret, os.path.join(d.state_dir, "keeper.pid.tmp")))
    assert refusal(d) == (f"gpumemd: refusing the state directory {d.state_dir}: it is owned "
                          "by uid 65534, not root")
    assert_untouched(secret)
    assert sorted(os.listdir(d.state_dir)) == ["gpumemd.lock", "keeper.pid.tmp"]


def _writable(base: str) -> tuple[str, str]:
    path = os.path.join(base, "dir")
    os.mkdir(path)
    os.chmod(path, 0o777)
    return path, f"{path}: it is writable by group or others (mode 0777)"


def _group_writable(base: str) -> tuple[str, str]:
    path = os.path.join(base, "dir")
    os.mkdir(path)
    os.chmod(path, 0o770)
    return path, f"{path}: it is writable by group or others (mode 0770)"


def _symlink(base: str) -> tuple[str, str]:
    real = os.path.join(base, "real")
    os.mkdir(real, 0o700)
    path = os.path.join(base, "dir")
    os.symlink(real, path)
    return path, f"{path}: it is a symlink"


def _under_nobodys(base: str) -> tuple[str, str]:
    """Root's own directory, but in one the attacker may rename it out of and replace."""
    evil = nobodys_dir(os.path.join(base, "evil"))
    path = os.path.join(evil, "dir")
    os.mkdir(path, 0o700)
    return path, f"{path}: {evil} is owned by uid 65534, not root"


def _through_nobodys_symlink(base: str) -> tuple[str, str]:
    """A symlink on the way that the attacker owns, in root's sticky directory: they may
    point it elsewhere at any time."""
    sticky = os.path.join(base, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    real = os.path.join(base, "real")
    os.mkdir(real, 0o755)
    link = os.path.join(sticky, "link")
    plant_as_nobody((real, link))
    return os.path.join(link, "dir"), f"{os.path.join(link, 'dir')}: {link} is owned by uid " \
                                      "65534, not root"


def _in_a_sticky_directory(base: str) -> tuple[str, str]:
    """/tmp itself is fine above gpumemd's directory, but never as it."""
    sticky = os.path.join(base, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    return sticky, f"{sticky}: it is writable by group or others (mode 1777)"


UNSAFE = {"world-writable": _writable, "group-writable": _group_writable, "symlink": _symlink,
          "under-nobodys-dir": _under_nobodys, "via-nobodys-symlink": _through_nobodys_symlink,
          "sticky-itself": _in_a_sticky_directory}


@pytest.mark.parametrize("kind", sorted(UNSAFE))
@pytest.mark.parametrize("option", ["state directory", "socket directory"])
def test_unsafe_directories_are_refused(daemon_factory, option, kind):
    d = daemon_factory(start=False)
    path, why = UNSAFE[kind](d.base)
    if option == "state directory":
        d.state_dir = path
    else:
        d.socket = os.path.join(path, "gpumemd.sock")
    assert refusal(d) == f"gpumemd: refusing the {option} {why}"
    assert not os.path.exists(os.path.join(path, "gpumemd.lock"))


def test_safe_layouts_start_as_before(daemon_factory):
    """What must keep working: a root-owned sticky parent (/tmp), a root-owned symlink on
    the way (/var/run -> /run), directories gpumemd makes itself."""
    d = daemon_factory(start=False)
    sticky = os.path.join(d.base, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    os.mkdir(os.path.join(d.base, "run"))
    os.symlink(os.path.join(d.base, "run"), os.path.join(d.base, "var-run"))
    d.state_dir = os.path.join(sticky, "gpumemd", "state")
    d.socket = os.path.join(d.base, "var-run", "gpumemd", "gpumemd.sock")
    d.start()
    d.cli("create", "kept", "--size", "1M", "--durable", check=True)
    assert stat.S_IMODE(os.lstat(d.socket).st_mode) == 0o666
    assert stat.S_IMODE(os.stat(d.state_dir).st_mode) == 0o700
    assert d.stop() == 0


def _check_as_daemon(path: str) -> str:
    try:
        return safe_directory("state directory", path, 0o700)
    except UnsafePath as exc:
        return str(exc)


def test_the_daemons_own_uid_may_own_its_directories(daemon_factory):
    """A developer's gpumemd (not root) keeps its state under their home, which they own:
    checked here as uid 65534 in a directory of its own (its interpreter cannot run the
    whole daemon, tests/users.py)."""
    base = daemon_factory(start=False).base         # other uids may pass through it
    home = nobodys_dir(os.path.join(base, "home"))
    state = os.path.join(home, ".local", "state", "gpumemd")
    assert run_as(_check_as_daemon, state) == state
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(state)).st_mode) == 0o755
    assert _check_as_daemon(state) == (f"refusing the state directory {state}: {home} is "
                                       "owned by uid 65534, not root")


# ---- the keeper's files ----------------------------------------------------------------------
def test_the_keepers_pid_file_never_follows_a_symlink(tmp_path):
    """Defence in depth under the directory check: a symlink at keeper.pid.tmp (a stale
    name the keeper writes its pid through) is replaced, not followed. Before, root's file
    got the keeper's pid."""
    secret = secret_file(str(tmp_path))
    sock, pidfile = str(tmp_path / "keeper.sock"), str(tmp_path / "keeper.pid")
    os.symlink(secret, pidfile + ".tmp")
    with open(tmp_path / "keeper.log", "wb") as log:      # not a pipe: the keeper keeps it
        proc = subprocess.run([PYTHON, "-m", "daemon.keeper", "--socket", sock, "--pidfile",
                               pidfile, "--detach"], cwd=ROOT, env=child_env(), timeout=30,
                              stdout=log, stderr=log)
    assert proc.returncode == 0, (tmp_path / "keeper.log").read_text()
    with open(pidfile) as f:
        pid = int(f.read())
    try:
        assert_untouched(secret)
        assert not os.path.lexists(pidfile + ".tmp")
    finally:
        os.kill(pid, 9)


def _tmpfs(path: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "gpumemd-test", path],
                   check=True, capture_output=True)


def test_the_keeper_tells_its_socket_by_device_and_inode(tmp_path):
    """The state directory's filesystem is replaced under a keeper (a new tmpfs mounted
    there): the new socket at keeper.sock has the keeper's inode number, on another
    device. Before, the keeper took it for its own: it stayed, unreachable, pinning what it
    held (and would have removed the other socket on its way out). Now it sees that it was
    replaced, exits, and leaves the new socket alone."""
    state = str(tmp_path / "state")
    os.mkdir(state, 0o700)
    try:
        _tmpfs(state)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    path = os.path.join(state, "keeper.sock")
    log = open(tmp_path / "keeper.log", "wb")
    keeper = subprocess.Popen([PYTHON, "-m", "daemon.keeper", "--socket", path], cwd=ROOT,
                              env=child_env(), stdout=log, stderr=log)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        wait_for(lambda: os.path.exists(path), 20, what="the keeper's socket")
        ours = os.lstat(path)
        subprocess.run(["umount", "-l", state], check=True)
        _tmpfs(state)
        other.bind(path)
        theirs = os.lstat(path)
        if theirs.st_ino != ours.st_ino:
            pytest.skip(f"this kernel gave the new socket another inode number "
                        f"({theirs.st_ino}, not {ours.st_ino}): nothing to tell apart")
        assert theirs.st_dev != ours.st_dev
        keeper.wait(10)
        assert os.path.exists(path)
        with open(tmp_path / "keeper.log") as f:
            assert "was replaced by another file" in f.read()
    finally:
        other.close()
        keeper.kill()
        keeper.wait()
        log.close()
        subprocess.run(["umount", "-l", state], capture_output=True)


# ---- --mount ---------------------------------------------------------------------------------
def test_a_mount_point_that_is_a_symlink_is_refused(daemon_factory):
    """The attacker's symlink in root's sticky directory (/tmp/gpumem -> a directory of
    root's). Before, the mount landed on the target."""
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    d = daemon_factory(start=False, mount=True, extra_args=["--host-capacity", "1G"])
    sticky = os.path.join(d.base, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    target = os.path.join(d.base, "target")
    os.mkdir(target, 0o755)
    d.mnt = os.path.join(sticky, "gpumem")
    plant_as_nobody((target, d.mnt))
    try:
        assert refusal(d) == f"gpumemd: refusing the mount point {d.mnt}: it is a symlink"
        assert not is_mounted(target)
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True)
