"""Running gpumemd from this checkout: the one daemon harness of the tests (tests/conftest.py's
fixtures build on it) and of the benchmarks (bench/core.py subclasses it).

A `Daemon` lives in a directory of its own (socket, state directory, log, optionally a mount
point), so two never share anything; it starts, restarts, talks to and cleans up after one
gpumemd, its keeper and its mount included.

Every process started with `child_env()` carries GPUMEMD_TEST_RUN=RUN_TAG in its environment,
and so does the keeper a gpumemd starts (it inherits the daemon's environment): the test
session finds its leftovers by that tag (`leftover_processes`), and never touches a gpumemd the
machine itself runs. RUN_TAG is per process: a benchmark's daemons carry a tag of their own.

Importable as `tests.harness` with the repository root on sys.path (pytest puts it there; a
bench script adds it, see bench/core.py). Standard library and the client library only.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
RUN_TAG_VAR = "GPUMEMD_TEST_RUN"
RUN_TAG = f"{os.getpid()}-{time.time_ns()}"
# The mount tests run on this backend: host in CI, cuda on the GPU machine (docs/gpu.md).
MOUNT_BACKEND = os.environ.get("GPUMEMD_TEST_BACKEND", "host")
_MODULES = {"gpumemctl": "gpumemctl.cli", "gpumemd": "daemon.main"}


# ---- the programs and their environment --------------------------------------------------------
def script_argv(name: str, installed: bool = False) -> list[str]:
    """The argv that runs our console script `name` ('gpumemctl' or 'gpumemd') with this
    interpreter. installed=True prefers the script pip put next to the interpreter (what a
    benchmark should time); by default the module runs from this checkout, installed or not."""
    if name not in _MODULES:
        raise ValueError(f"no console script {name!r}: one of {', '.join(_MODULES)}")
    script = os.path.join(os.path.dirname(PYTHON), name)
    if installed and os.access(script, os.X_OK):
        return [script]
    return [PYTHON, "-c", f"import sys; from {_MODULES[name]} import main; sys.exit(main())"]


def child_env(extra: dict | None = None) -> dict:
    """The environment of a gpumemd or gpumemctl we start: this checkout first on the path,
    nothing of a systemd unit or of the caller's socket, no /etc/gpumemd.toml, and the tag."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for var in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "GPUMEMD_SOCKET"):
        env.pop(var, None)
    env["GPUMEMD_CONFIG"] = ""     # hermetic: never the machine's /etc/gpumemd.toml
    env[RUN_TAG_VAR] = RUN_TAG
    env.update(extra or {})
    return env


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll until predicate() returns something true, and return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def make_base_dir(prefix: str = "gpumemd-test-") -> str:
    """A temp dir other uids can traverse (permission tests connect as another user)."""
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(base, 0o755)
    return base


# ---- the keeper: it outlives every gpumemd by design, so whoever started one ends it -----------
def keeper_pid(state_dir: str) -> int | None:
    """The pid of the keeper serving a state directory (its pid file), if any."""
    try:
        with open(os.path.join(state_dir, "keeper.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def is_keeper(pid: int, state_dir: str) -> bool:
    """Whether `pid` is the keeper of `state_dir` (a stale pid file may name another
    process by now, which must never be killed)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"daemon.keeper" in argv and any(state_dir.encode() in arg for arg in argv)


def kill_keeper(state_dir: str, pid: int | None = None) -> None:
    """SIGKILL the keeper of a state directory (by default the one its pid file names)."""
    pid = pid or keeper_pid(state_dir)
    if pid and is_keeper(pid, state_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---- the mount ---------------------------------------------------------------------------------
def fuse_missing() -> str | None:
    """Why no FUSE mount can be made here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: no FUSE here"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


def is_mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 1)


def unmount(path: str) -> str:
    """Detach a mount a dead or stopped daemon left (never leave one behind: it would hang or
    fail whatever walks /tmp next). Says what took it away: 'gpumemd' (nothing was left),
    'fusermount3 -u -z', 'umount -l', or 'STILL MOUNTED'."""
    if not is_mounted(path):
        return "gpumemd"
    for argv in (["fusermount3", "-u", "-z", path], ["umount", "-l", path]):
        if shutil.which(argv[0]):
            subprocess.run(argv, capture_output=True)
        if not is_mounted(path):
            return " ".join(argv[:-1])
    return "STILL MOUNTED"


# ---- the daemon --------------------------------------------------------------------------------
class Daemon:
    """A gpumemd process in its own directory. Restartable; `cleanup()` ends it, its keeper
    and its mount (the test fixtures and the benchmarks call it at the end)."""

    def __init__(self, base: str, backend: str = "host", extra_args=(), env=None,
                 mount: bool = False, log_level: str | None = "debug",
                 installed: bool = False):
        self.base = base
        self.mnt = os.path.join(base, "mnt") if mount else None
        self.socket = os.path.join(base, "gpumemd.sock")
        self.state_dir = os.path.join(base, "state")
        self.log_path = os.path.join(base, "gpumemd.log")
        self.backend = backend
        self.extra_args = list(extra_args)
        self.extra_env = env or {}
        self.log_level = log_level         # None: the daemon's default (a benchmark's choice)
        self.installed = installed         # run the installed console scripts (benchmarks)
        self.proc: subprocess.Popen | None = None
        self.keeper_pids: set[int] = set()  # every keeper seen: a restart may start a new one
        self.allow_errors = False   # set by tests that provoke logged errors on purpose

    # ---- lifecycle ----------------------------------------------------------------------
    def argv(self) -> list[str]:
        return script_argv("gpumemd", self.installed) + [
            "--backend", self.backend, "--socket", self.socket, "--state-dir", self.state_dir,
            *(["--log-level", self.log_level] if self.log_level else []),
            *(["--mount", self.mnt] if self.mnt else []),
            *self.extra_args]

    def environment(self) -> dict:
        return child_env(self.extra_env)

    def spawn(self, **popen) -> float:
        """Start gpumemd without waiting; returns the perf_counter() taken just before."""
        popen.setdefault("stdin", subprocess.DEVNULL)
        log = open(self.log_path, "ab")
        started = time.perf_counter()
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log,
                                     env=self.environment(), **popen)
        log.close()
        return started

    def start(self, wait: bool = True, timeout: float = 15.0, **popen) -> Daemon:
        """Spawn; with `wait`, return once it serves (at most `timeout` seconds)."""
        self.spawn(**popen)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 15.0, interval: float = 0.02) -> None:
        """Until a Client connects; fails at once, with the log, if gpumemd exits first."""
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
        wait_for(ready, timeout, interval, what="gpumemd to serve its socket")
        self.note_keeper()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15)

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            return self.proc.wait(15)
        return self.proc.returncode if self.proc else 0

    def restart(self, hard: bool = True) -> None:
        self.kill9() if hard else self.stop()
        self.start()

    def note_keeper(self) -> None:
        """Remember the keeper serving now, for cleanup() (a later one may replace it)."""
        pid = self.keeper_pid()
        if pid:
            self.keeper_pids.add(pid)

    def keeper_pid(self) -> int | None:
        return keeper_pid(self.state_dir)

    def kill_keeper(self) -> None:
        kill_keeper(self.state_dir)

    def cleanup(self) -> None:
        """Kill gpumemd if it still runs, then every keeper it had, then detach its mount."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.note_keeper()
        for pid in self.keeper_pids:
            kill_keeper(self.state_dir, pid)
        self.unmount()

    def mounted(self) -> bool:
        return self.mnt is not None and is_mounted(self.mnt)

    def unmount(self) -> str | None:
        """Detach the mount if the daemon left it; what took it away (see unmount())."""
        return unmount(self.mnt) if self.mnt is not None else None

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, n: int = 4000) -> str:
        return self.log()[-n:]

    # ---- talking to it ------------------------------------------------------------------
    def client(self, **kw):
        from gpumemctl import Client
        return Client(self.socket, **kw)

    def cli(self, *args: str, input: bytes | None = None, check: bool | int = False,
            env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run `gpumemctl --socket S ARGS...`; check=True wants exit 0, an int wants it."""
        proc = subprocess.run(script_argv("gpumemctl", self.installed)
                              + ["--socket", self.socket, *args],
                              input=input, capture_output=True, env=child_env(env),
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


# ---- what a run left behind, and what this machine has -----------------------------------------
def leftover_processes(tag: str = RUN_TAG) -> list[tuple[int, str]]:
    """(pid, command line) of every live gpumemd or keeper whose environment carries `tag`."""
    marker = f"{RUN_TAG_VAR}={tag}".encode()
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


_gpu_probe: dict = {}


def usable_gpus() -> int:
    """How many CUDA devices gpumemd's cuda backend could use (VMM + POSIX-fd handles).
    Probed once, in a subprocess: the test process itself never loads CUDA for this, and a
    machine without cuda-python or a driver simply answers 0."""
    if "count" not in _gpu_probe:
        code = "from gpumemctl import cudadrv; print(len(cudadrv.usable_devices()))"
        try:
            proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                                  env=child_env(), timeout=120)
            _gpu_probe["count"] = int(proc.stdout.strip()) if proc.returncode == 0 else 0
        except (OSError, ValueError, subprocess.TimeoutExpired):
            _gpu_probe["count"] = 0
    return _gpu_probe["count"]


def store_random(d: Daemon, name: str, size: int = 4 << 20, durable: bool = True) -> bytes:
    """Create `name` through the CLI and fill it with random bytes; returns them."""
    data = os.urandom(size)
    d.cli("create", name, "--size", str(size), *(["--durable"] if durable else []),
          check=True)
    d.cli("write", name, input=data, check=True)
    return data


def fill_filesystem(directory: str) -> str:
    """Write zeros into `directory` until its filesystem has no byte left."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = bytes(64 << 10)
        while chunk:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                chunk = chunk[:len(chunk) // 2]
    finally:
        os.close(fd)
    return path


def rss_bytes(pid: int) -> int:
    """A process's resident memory, from /proc (tests that bound what the daemon holds)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")
