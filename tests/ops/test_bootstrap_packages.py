"""Issue 12, section 8: what scripts/bootstrap.sh installs for `make run` and for `make test`,
and that the README says the same.

The script runs for real with a PATH of stand-ins: `id` says root, `apt-get` and the venv's
python only write their arguments down, and no other program the script looks for is there,
so it asks for every package it knows. Nothing is installed."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.harness import ROOT

RUN = {"fuse3", "libfuse3-dev", "pkg-config", "gcc", "python3-dev", "python3-venv"}
TEST_ONLY = {"attr", "jq", "zsh", "fish", "mandoc", "systemd", "tmux", "rsync", "g++"}
TOOLS = ("dirname", "cksum", "cut", "rm", "touch")


def fake(path, text: str) -> None:
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)


def bootstrap(tmp_path, purpose: str) -> tuple[set[str], list[str]]:
    """(apt packages asked for, the venv python's command lines) of one bootstrap run."""
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    log = tmp_path / "log"
    fake(bin_dir / "id", "echo 0\n")
    fake(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}\n')
    fake(venv / "bin" / "python", f'echo "python $*" >> {log}\n')
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            pytest.skip(f"{tool} is not installed")
        os.symlink(real, bin_dir / tool)
    proc = subprocess.run(["/bin/sh", os.path.join(ROOT, "scripts", "bootstrap.sh"), purpose],
                          env={"PATH": str(bin_dir), "VENV": str(venv),
                               "PYTHON": str(tmp_path / "no-python3")},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    installs = [line.split() for line in lines
                if line.startswith("apt-get") and " install " in line]
    assert len(installs) == 1, lines
    packages = {word for word in installs[0][1:] if not word.startswith("-") and word != "install"}
    assert any(name.startswith(".bootstrap-") and name.endswith(f"-{purpose}")
               for name in os.listdir(venv)), os.listdir(venv)
    return packages, [line for line in lines if line.startswith("python")]


def test_make_run_installs_what_running_needs_and_nothing_the_tests_drive(tmp_path):
    packages, pythons = bootstrap(tmp_path, "run")
    assert packages == RUN
    target = [line for line in pythons if " -e " in line]
    assert len(target) == 1 and target[0].endswith(" -e .[all]"), pythons


def test_make_test_adds_the_test_extras_and_the_programs_the_tests_drive(tmp_path):
    packages, pythons = bootstrap(tmp_path, "test")
    assert packages == RUN | TEST_ONLY
    target = [line for line in pythons if " -e " in line]
    assert len(target) == 1 and target[0].endswith(" -e .[all,test,lint]"), pythons


def readme_bullet(text: str, head: str) -> str:
    """The README's bullet that starts with `head`, through to the next bullet or blank line."""
    match = re.search(rf"^- {re.escape(head)}.*?(?=^- |^\s*$)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no README bullet starting {head!r}"
    return match.group(0)


def test_the_readme_names_what_each_installs():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    run = set(re.findall(r"`([^`]+)`", readme_bullet(text, "`make run`:")))
    test = set(re.findall(r"`([^`]+)`", readme_bullet(text, "`make test`:")))
    assert RUN <= run, RUN - run
    assert not TEST_ONLY & run, TEST_ONLY & run
    assert TEST_ONLY <= test, TEST_ONLY - test
