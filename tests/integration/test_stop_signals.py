"""gpumemd stops cleanly on SIGTERM and SIGINT whatever the libraries in its process do to
their handlers (daemon/signals.py). On the GPU machine the CUDA driver's and NVRTC's first
calls on a worker thread put SIGTERM's handler back to the default while gpumemd installed
its own, and SIGTERM then killed gpumemd outright (exit -15: no clean stop). Here a library
of the same behaviour is stood in by a thread that resets both handlers to SIG_DFL through
libc, after the daemon serves."""
from __future__ import annotations

import os
import signal
import textwrap

import pytest

from tests.harness import ROOT, wait_for

RESETTER = textwrap.dedent("""
    import ctypes, os, threading, time

    def _is_gpumemd():
        with open("/proc/self/cmdline", "rb") as f:
            cmd = f.read()
        return b"daemon.main" in cmd and b"--backend" in cmd

    if _is_gpumemd():
        def _reset():
            time.sleep(0.3)
            libc = ctypes.CDLL(None)
            libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
            for signum in (15, 2):
                libc.signal(signum, None)            # SIG_DFL
            open(os.environ["RESET_DONE"], "w").close()
        threading.Thread(target=_reset, daemon=True).start()
""")


@pytest.fixture
def reset_env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(RESETTER)
    done = tmp_path / "reset-done"
    path = os.pathsep.join([str(site), ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {"PYTHONPATH": path, "RESET_DONE": str(done)}, done


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_library_resetting_the_handlers_does_not_kill_gpumemd(daemon_factory, reset_env,
                                                                   sig):
    env, done = reset_env
    d = daemon_factory(env=env)
    wait_for(done.exists, what="the stand-in library to reset the handlers")
    d.client().create("x", 4096, durable=True)
    assert d.stop(sig) == 0
    assert f"received {sig.name}; stopping" in d.log()
    d.start()                                    # the durable allocation is still there
    assert d.client().info("x")["state"] == "ready"


def _blocked(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("SigBlk:"))
    return int(line.split()[1], 16)


def test_the_keeper_takes_the_stop_signals_though_gpumemd_blocks_them(daemon):
    stop = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    assert _blocked(daemon.proc.pid) & stop == stop
    keeper = daemon.keeper_pid()
    assert keeper and _blocked(keeper) & stop == 0
