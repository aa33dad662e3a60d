"""The examples/ scripts run as a reader runs them (on the host backend, small), and say
their checks passed: they cannot drift from the API unnoticed."""
from __future__ import annotations

import os
import subprocess

from tests.harness import PYTHON, ROOT, child_env, leftover_processes


def test_engine_restart_serves_the_same_answers_after_sigkill():
    proc = subprocess.run([PYTHON, os.path.join(ROOT, "examples", "engine_restart.py"),
                           "--size", "16M", "--layers", "2", "--restarts", "1"],
                          env=child_env(), cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "restart 1 after SIGKILL" in out and "checks: all passed" in out, out
    assert "time to first inference after a restart" in out
    assert "0 attach holder(s) left" in out
    assert leftover_processes() == []           # its own gpumemd and keeper are gone
