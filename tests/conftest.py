"""Shared fixtures: a real gpumemd in a temporary directory (tests/harness.py), driven through
the CLI and the client library, with or without a real FUSE mount. Each daemon has its own
socket and state directory, so tests never share one. Helpers a test module needs come from
tests/harness.py (and tests/sizes.py, tests/users.py), never from a conftest.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.harness import (
    MOUNT_BACKEND,
    Daemon,
    fuse_missing,
    leftover_processes,
    make_base_dir,
    usable_gpus,
)


def error_excerpt(log: str) -> str:
    """The log around its first error or traceback, then its tail: a busy daemon's last
    4,000 characters need not hold the line that failed the test."""
    first = min(i for i in (log.find("Traceback"), log.find(" ERROR: ")) if i >= 0)
    start = log.rfind("\n", 0, max(0, first - 1000)) + 1
    around = log[start:first + 3000]
    if start + len(around) >= len(log) - 2000:
        return log[start:]
    return around + "\n[...]\n" + log[-2000:]


# The layout before issue 26: memory and parity of its own per allocation.
SLABS_OFF = ["--slabs", "off", "--parity-arenas", "off"]


@pytest.fixture
def daemon_factory(request):
    made: list[Daemon] = []
    # A test marked slabs_off asserts the layout of memory of its own per allocation
    # (a granule each, parity of its own, a keeper deposit each): its daemons run with
    # --slabs off --parity-arenas off.
    slabs_off = request.node.get_closest_marker("slabs_off") is not None

    def make(start: bool = True, **kw) -> Daemon:
        if slabs_off:
            kw["extra_args"] = [*kw.get("extra_args", ()), *SLABS_OFF]
        d = Daemon(make_base_dir(), **kw)
        made.append(d)
        return d.start() if start else d

    yield make
    problems = []
    for d in made:
        d.cleanup()
        log = d.log()
        if not d.allow_errors and ("Traceback" in log or " ERROR: " in log):
            problems.append(error_excerpt(log))
        shutil.rmtree(d.base, ignore_errors=True)
    if problems:
        pytest.fail("gpumemd logged unexpected errors:\n" + "\n---\n".join(problems))


@pytest.fixture
def ecc_daemon(daemon_factory):
    """A daemon whose memory tests may damage on purpose (`gpumemctl debug corrupt`)."""
    d = daemon_factory(extra_args=["--enable-fault-injection", "--host-capacity", "512M"])
    d.allow_errors = True          # uncorrectable damage is logged at ERROR, on purpose
    return d


@pytest.fixture
def daemon(daemon_factory) -> Daemon:
    return daemon_factory()


# ---- with a FUSE mount: the host backend in CI, cuda with GPUMEMD_TEST_BACKEND=cuda (docs/gpu.md)
@pytest.fixture
def mounted_factory(daemon_factory):
    """Like daemon_factory, each daemon serving a mount at `d.mnt` (skips without FUSE)."""
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)

    def make(**kw):
        kw.setdefault("backend", MOUNT_BACKEND)
        extra = list(kw.pop("extra_args", ()))
        if MOUNT_BACKEND == "host" and not any(a.startswith("--host-capacity") for a in extra):
            extra += ["--host-capacity", "1G"]
        return daemon_factory(mount=True, extra_args=extra, **kw)
    return make


@pytest.fixture
def mounted(mounted_factory):
    """A daemon serving a mount; `mounted.mnt` is the mount point."""
    return mounted_factory()


@pytest.fixture(autouse=True)
def _no_unexpected_errors_logged(caplog):
    """Fail a test that logged an error it did not expect (keeps the logs honest)."""
    yield
    bad = [r for r in caplog.get_records("call") if r.levelno >= logging.ERROR
           and not getattr(r, "expected", False)]
    if bad:
        pytest.fail("unexpected errors logged: " + "; ".join(r.getMessage() for r in bad))


# ---- no gpumemd or keeper outlives the run ------------------------------------------------
def _interrupted(signum, frame):
    """SIGTERM (`timeout`, CI's end, `make` stopped) ends the run as Ctrl-C does, so
    pytest_sessionfinish below still ends the daemons and keepers the tests started."""
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _interrupted)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run if a gpumemd or keeper that a test started is still alive (a test that
    forgot to stop one would leave it running on the developer's machine), then end them.
    Every one a test starts carries this session's tag (tests/harness.py child_env)."""
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


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and usable_gpus() == 0:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in gpu_items:
            item.add_marker(skip)


# ---- a state directory on a small tmpfs, for a full disk for real (needs root) -------------
@pytest.fixture
def small_state_disk(daemon_factory, request):
    d = daemon_factory(start=False)
    os.makedirs(d.state_dir)
    # mode=0700: a tmpfs root is 1777 by default, a state directory gpumemd refuses
    # (docs/security.md, "Paths under directories other users control").
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                              d.state_dir],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", d.state_dir]))
    d.allow_errors = True           # the full disk is logged, as it should be
    return d.start()


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory):
    """The fake libcuda.so.1 (tests/fakecuda), built once a session; its directory."""
    from tests import fakecuda
    libdir = fakecuda.build(str(tmp_path_factory.mktemp("fakecuda")))
    if libdir is None:
        pytest.skip("no C compiler to build the fake CUDA driver")
    return libdir
