"""Issue 12, section 7: the session-end check of tests/conftest.py (pytest_sessionfinish)
fails a run that leaves a gpumemd or a keeper behind, names them, and ends them.

Each case runs a small pytest session of its own (with tests/conftest.py as its plugin, so
its own run tag) whose one test forgets something: the keeper alone (what
test_config.py::test_file_values_apply_and_the_command_line_wins used to leave: a gpumemd
stopped, its keeper not), or the daemon and its keeper. A third stops both and must pass."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.harness import ROOT, child_env, kill_keeper, make_base_dir

INNER = textwrap.dedent("""
    import os

    from tests.harness import Daemon


    def test_inner():
        d = Daemon(os.environ["LEAK_BASE"]).start()
        how = os.environ["LEAK_HOW"]
        if how == "keeper":
            d.stop()                       # SIGTERM: the keeper outlives it, by design
        elif how == "nothing":
            d.stop()
            d.kill_keeper()
""")


def processes_under(base: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line names `base`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if base in command and int(entry) != os.getpid():
            found.append((int(entry), command))
    return found


@pytest.mark.parametrize("how, left", [("keeper", 1), ("daemon", 2), ("nothing", 0)])
def test_the_session_fails_while_a_gpumemd_or_keeper_it_started_lives(tmp_path, how, left):
    base = make_base_dir("gpumemd-leak-")
    inner = tmp_path / "test_inner_leak.py"
    inner.write_text(INNER)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-p", "tests.conftest", "--rootdir", str(tmp_path), str(inner)],
            cwd=ROOT, env=child_env({"LEAK_BASE": base, "LEAK_HOW": how}),
            capture_output=True, text=True, timeout=120, check=False)
        out = proc.stdout + proc.stderr
        assert "1 passed" in out, out
        if left:
            assert proc.returncode == 1, out
            assert (f"the tests left {left} gpumemd/keeper process(es) running (now killed)"
                    in out), out
            assert out.count(f"--state-dir {base}/state") == (left == 2), out
            assert out.count(f"daemon.keeper --socket {base}/state/keeper.sock") == 1, out
        else:
            assert proc.returncode == 0, out
            assert "gpumemd/keeper process(es) running" not in out, out
        assert processes_under(base) == [], "the check did not end what it found"
    finally:
        for pid, _ in processes_under(base):      # only if the check failed to end them
            if "daemon.keeper" in _:
                kill_keeper(os.path.join(base, "state"), pid)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(base, ignore_errors=True)
