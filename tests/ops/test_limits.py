"""scripts/check_limits.py, the size limits of `make lint` (issue 25): on small trees made for
the purpose, a module one line too long and a daemon class with one public method too many
are named and fail it; the FUSE interface and private methods do not count; a tree within
the bounds passes silently."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.harness import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "check_limits.py")


def run(tree) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, str(tree)], capture_output=True, text=True,
                          timeout=60)


def make_tree(tmp_path, files: dict[str, str]):
    for package in ("daemon", "gpumemctl", "tui"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def methods(count: int, prefix: str = "m") -> str:
    return "".join(f"    def {prefix}{i}(self):\n        pass\n" for i in range(count))


def test_a_tree_within_the_bounds_passes_silently(tmp_path):
    tree = make_tree(tmp_path, {
        "daemon/core/a.py": "x = 1\n" * 500,
        "daemon/b.py": "class B:\n" + methods(25) + methods(40, "_private"),
        "gpumemctl/c.py": "class C:\n" + methods(60),      # the limit is the daemon's
    })
    proc = run(tree)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stdout + proc.stderr


def test_a_module_over_500_lines_is_named(tmp_path):
    tree = make_tree(tmp_path, {"tui/deep/big.py": "x = 1\n" * 501})
    proc = run(tree)
    assert proc.returncode == 1
    assert proc.stdout == "tui/deep/big.py: 501 lines, more than 500\n"


def test_a_daemon_class_over_25_public_methods_is_named(tmp_path):
    tree = make_tree(tmp_path, {"daemon/verbs/big.py": "class Big:\n" + methods(26)})
    proc = run(tree)
    assert proc.returncode == 1
    assert proc.stdout == ("daemon/verbs/big.py:1: class Big has 26 public methods, more than "
                           "25\n")


def test_the_fuse_interface_is_exempt(tmp_path):
    tree = make_tree(tmp_path, {"daemon/fs/ops.py": "import pyfuse3\n\n\n"
                                "class Ops(pyfuse3.Operations):\n" + methods(40)})
    assert run(tree).returncode == 0


def test_the_tree_itself_is_within_the_bounds_and_make_lint_checks_them():
    """The repository as it is passes, and `make lint` (what .ci/run calls first) runs the
    script, so a feature that re-grows a centre fails CI, not a later review."""
    proc = run(ROOT)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stdout
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        makefile = f.read()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "scripts/check_limits.py" in lint
