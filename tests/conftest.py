"""Shared fixtures: a real gpumemd in a temporary directory, driven through the CLI and the
client library. Each daemon has its own socket and state directory, so tests never share one.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
# Every gpumemd the tests start carries this in its environment, and so does the keeper it
# starts (the keeper inherits the daemon's environment): the session-end check below finds
# leftovers by it, and never touches a gpumemd that the machine itself runs.
TEST_RUN_TAG = f"{os.getpid()}-{time.time_ns()}"
TEST_RUN_VAR = "GPUMEMD_TEST_RUN"


def _bin(name: str) -> list[str]:
    """Run our console scripts with this interpreter (works without installing)."""
    module = {"gpumemctl": "gpumemctl.cli", "gpumemd": "daemon.main"}[name]
    return [PYTHON, "-c", f"import sys; from {module} import main; sys.exit(main())"]


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "GPUMEMD_SOCKET"):
        env.pop(var, None)
    env["GPUMEMD_CONFIG"] = ""     # hermetic: never the machine's /etc/gpumemd.toml
    env[TEST_RUN_VAR] = TEST_RUN_TAG
    env.update(extra or {})
    return env


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Daemon:
    """A gpumemd process in its own directory. Restartable; cleaned up by the fixture."""

    def __init__(self, base: str, backend: str = "host", extra_args=(), env=None,
                 mount: bool = False):
        self.base = base
        self.mnt = os.path.join(base, "mnt") if mount else None
        self.socket = os.path.join(base, "gpumemd.sock")
        self.state_dir = os.path.join(base, "state")
        self.log_path = os.path.join(base, "gpumemd.log")
        self.backend = backend
        self.extra_args = list(extra_args)
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.allow_errors = False   # set by tests that provoke logged errors on purpose

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, wait: bool = True, **popen) -> "Daemon":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            _bin("gpumemd") + ["--backend", self.backend, "--socket", self.socket,
                               "--state-dir", self.state_dir, "--log-level", "debug",
                               *(["--mount", self.mnt] if self.mnt else []),
                               *self.extra_args],
            stdout=log, stderr=log, env=_env(self.extra_env), **popen)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        from gpumemctl import Client
        from gpumemctl.protocol import NotRunning

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"gpumemd exited with {self.proc.returncode}:\n"
                                     + self.log())
            try:
                Client(self.socket).close()
                return True
            except NotRunning:
                return False
        wait_for(ready, timeout, what="gpumemd to serve its socket")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            return self.proc.wait(15)
        return self.proc.returncode if self.proc else 0

    def restart(self, hard: bool = True) -> None:
        self.kill9() if hard else self.stop()
        self.start()

    def keeper_pid(self) -> int | None:
        return keeper_pid(self.state_dir)

    def kill_keeper(self) -> None:
        kill_keeper(self.state_dir)

    def cleanup(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.kill_keeper()
        self.unmount()

    def mounted(self) -> bool:
        return self.mnt is not None and is_mounted(self.mnt)

    def unmount(self) -> None:
        """Detach the mount if a dead daemon left it (never leave one behind: it would hang
        or fail whatever walks /tmp next)."""
        if self.mnt is not None and is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)
            if is_mounted(self.mnt):
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- talking to it ------------------------------------------------------------------
    def client(self, **kw):
        from gpumemctl import Client
        return Client(self.socket, **kw)

    def cli(self, *args: str, input: bytes | None = None, check: bool | int = False,
            env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run `gpumemctl --socket S ARGS...`; check=True wants exit 0, an int wants it."""
        proc = subprocess.run(_bin("gpumemctl") + ["--socket", self.socket, *args],
                              input=input, capture_output=True, env=_env(env),
                              timeout=timeout)
        want = 0 if check is True else check
        if want is not False and proc.returncode != want:
            raise AssertionError(f"gpumemctl {' '.join(args)} exited {proc.returncode}, "
                                 f"wanted {want}\nstdout: {proc.stdout[-2000:]!r}\n"
                                 f"stderr: {proc.stderr.decode(errors='replace')}")
        return proc

    def cli_json(self, *args: str):
        import json
        return json.loads(self.cli(*args, "--json", check=True).stdout)


def keeper_pid(state_dir: str) -> int | None:
    """The pid of the keeper serving a state directory (its pid file), if any."""
    try:
        with open(os.path.join(state_dir, "keeper.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def kill_keeper(state_dir: str) -> None:
    """End the keeper of a state directory: it outlives every gpumemd by design, so a test
    that started one must end it."""
    pid = keeper_pid(state_dir)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def is_mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 1)


def make_base_dir() -> str:
    """A temp dir other uids can traverse (permission tests connect as another user)."""
    base = tempfile.mkdtemp(prefix="gpumemd-test-", dir="/tmp")
    os.chmod(base, 0o755)
    return base


@pytest.fixture
def daemon_factory():
    made: list[Daemon] = []

    def make(start: bool = True, **kw) -> Daemon:
        d = Daemon(make_base_dir(), **kw)
        made.append(d)
        return d.start() if start else d

    yield make
    problems = []
    for d in made:
        d.cleanup()
        log = d.log()
        if not d.allow_errors and ("Traceback" in log or " ERROR: " in log):
            problems.append(log[-4000:])
        shutil.rmtree(d.base, ignore_errors=True)
    if problems:
        pytest.fail("gpumemd logged unexpected errors:\n" + "\n---\n".join(problems))


@pytest.fixture
def daemon(daemon_factory) -> Daemon:
    return daemon_factory()


@pytest.fixture(autouse=True)
def _no_unexpected_errors_logged(caplog):
    """Fail a test that logged an error it did not expect (keeps the logs honest)."""
    yield
    bad = [r for r in caplog.get_records("call") if r.levelno >= logging.ERROR
           and not getattr(r, "expected", False)]
    if bad:
        pytest.fail("unexpected errors logged: " + "; ".join(r.getMessage() for r in bad))


# ---- no gpumemd or keeper outlives the run ------------------------------------------------
def leftover_processes(tag: str = TEST_RUN_TAG) -> list[tuple[int, str]]:
    """(pid, command line) of every live gpumemd or keeper whose environment carries `tag`."""
    marker = f"{TEST_RUN_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:                       # gone meanwhile, or not ours to read
            continue
        command = b" ".join(argv).decode(errors="replace")
        if marker in environ and ("daemon.main" in command or "daemon.keeper" in command):
            found.append((int(entry), command))
    return found


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a gpumemd or keeper that a test started is still alive (a test that
    forgot to stop one would leave it running on the developer's machine), then end them."""
    deadline = time.monotonic() + 5        # a daemon stopped just now may still be exiting
    while (left := leftover_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = "\n".join(f"  pid {pid}: {command}" for pid, command in left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"the tests left {len(left)} gpumemd/keeper process(es) running (now killed):\n"
    if reporter is not None:
        reporter.write_line(message + lines, red=True)
    else:
        sys.stderr.write(message + lines + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---- GPU tests (-m gpu): skipped with one reason where no GPU can serve them ----------------
GPU_SKIP_REASON = "no NVIDIA GPU with VMM support here"
_gpu_probe: dict = {}


def usable_gpus() -> int:
    """How many CUDA devices gpumemd's cuda backend could use (VMM + POSIX-fd handles).
    Probed once, in a subprocess: the test process itself never loads CUDA for this, and a
    machine without cuda-python or a driver simply answers 0."""
    if "count" not in _gpu_probe:
        code = "from gpumemctl import cudadrv; print(len(cudadrv.usable_devices()))"
        try:
            proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                                  env=_env(), timeout=120)
            _gpu_probe["count"] = int(proc.stdout.strip()) if proc.returncode == 0 else 0
        except (OSError, ValueError, subprocess.TimeoutExpired):
            _gpu_probe["count"] = 0
    return _gpu_probe["count"]


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and usable_gpus() == 0:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in gpu_items:
            item.add_marker(skip)
