"""Packaging: the base install is the client; the daemon, the monitor and CUDA come by extra.

The wheel is built from a clean copy of the checkout, as pip and pipx build it. Its metadata
must keep gpumemd's, the monitor's and CUDA's packages out of the base requirements. Then the
wheel goes into a fresh virtual environment (no system site-packages, pip fetching only the
base requirements from the index), as into an application container that only attaches
memory: there the client works against a real gpumemd run from the test environment, and
what needs an extra says which, in one line (docs/operations.md, "Installing only the
client"). The version is written in one place, gpumemctl/protocol/release.py.
"""
from __future__ import annotations

import email.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from gpumemctl import __version__
from tests.harness import ROOT, child_env, script_argv

PIP_TIMEOUT = ["--timeout", "20", "--retries", "1"]    # an unreachable index fails fast
# Import names that only an extra brings: the client-only environment must have none.
EXTRA_MODULES = ("trio", "pyfuse3", "numpy", "textual", "cuda", "pynvml")


def skip_unless_pip_reaches_an_index(tmp_path) -> None:
    """Skip (an offline machine cannot build or install) unless pip can fetch from its index;
    when it can, the caller's failure is a real one."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                           "--disable-pip-version-check", *PIP_TIMEOUT, "-d", str(tmp_path),
                           "typer"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"pip cannot reach a package index: {why}")


# ---- the wheel ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"             # a clean copy: an old build/ in the tree would hide a miss
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", ".gpu", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
        ".hypothesis", "__snapshots__", ".mypy_cache", ".ruff_cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--disable-pip-version-check", *PIP_TIMEOUT, "-w", str(out),
                           str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        skip_unless_pip_reaches_an_index(out / "probe")     # the build needs setuptools
        pytest.fail("the wheel does not build:\n" + proc.stderr[-2000:])
    (path,) = out.glob("gpumemctl-*.whl")
    return str(path)


@pytest.fixture(scope="module")
def metadata(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


def requirements(metadata) -> dict[str, set[str]]:
    """extra ("" for the base install) -> the distributions it requires, extras kept
    ("gpumemctl[cuda,daemon,tui]")."""
    found: dict[str, set[str]] = {}
    for line in metadata.get_all("Requires-Dist") or []:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        name = re.split(r"[\s<>=!~(]", requirement.strip(), maxsplit=1)[0]   # extras kept
        found.setdefault(extra.group(1) if extra else "", set()).add(name.lower())
    return found


def test_the_base_install_requires_the_client_alone(metadata):
    base = requirements(metadata)[""]
    assert base == {"typer"}
    assert not base & {"pyfuse3", "trio", "textual", "cuda-python", "nvidia-ml-py", "numpy"}


def test_the_extras_bring_the_daemon_the_monitor_and_cuda(metadata):
    extras = requirements(metadata)
    assert set(metadata.get_all("Provides-Extra")) >= {"daemon", "tui", "cuda", "all", "test"}
    assert extras["daemon"] >= {"trio", "pyfuse3", "numpy", "nvidia-ml-py"}
    assert extras["tui"] == {"textual"}
    assert extras["cuda"] == {"cuda-python"}
    assert extras["snapshot"] == {"xxhash", "obstore"}
    assert extras["weights"] == {"safetensors", "numpy", "ml_dtypes"}
    assert extras["all"] == {"gpumemctl[cuda,daemon,snapshot,tui,weights]"}
    assert "gpumemctl[all]" in extras["test"]          # CI's suite runs all of it


def test_the_wheel_has_the_one_version(metadata):
    assert metadata["Version"] == __version__          # setuptools read protocol/release.py


def test_the_version_is_written_once():
    """No second copy to forget on a release: pyproject.toml takes it from the module, and no
    other source file spells it."""
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project and "version" in project["dynamic"]
    root = pathlib.Path(ROOT)
    spelled = [str(path.relative_to(root)) for package in ("gpumemctl", "daemon", "tui")
               for path in sorted((root / package).rglob("*.py"))
               if f'"{__version__}"' in path.read_text(encoding="utf-8")]
    assert spelled == ["gpumemctl/protocol/release.py"]


def test_the_programs_and_the_daemon_say_the_one_version(daemon):
    """gpumemctl --version, gpumemd --version and the daemon's hello say the one version
    that gpumemctl/protocol/release.py holds."""
    assert daemon.cli("--version", check=True).stdout == f"gpumemctl {__version__}\n".encode()
    gpumemd = subprocess.run(script_argv("gpumemd") + ["--version"], capture_output=True, text=True,
                             env=child_env(), timeout=60)
    assert (gpumemd.returncode, gpumemd.stdout) == (0, f"gpumemd {__version__}\n")
    with daemon.client() as c:
        assert c.hello["daemon"] == f"gpumemd {__version__}"


# ---- the wheel alone, in a fresh environment ------------------------------------------------
class ClientEnv:
    """A virtual environment holding the wheel and its base requirements only."""

    def __init__(self, path: str):
        self.path, self.bin = path, os.path.join(path, "bin")
        self.cwd = os.path.dirname(path)    # never the checkout: its packages would import

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "GPUMEMD_SOCKET", "VIRTUAL_ENV")}
        env["PYTHONNOUSERSITE"] = "1"        # ~/.local's packages are not the container's
        return env

    def run(self, program: str, *args: str, stdin: bytes | None = None):
        return subprocess.run([os.path.join(self.bin, program), *args], input=stdin,
                              capture_output=True, env=self.env(), cwd=self.cwd, timeout=120)

    def python(self, code: str, *args: str):
        return self.run("python", "-c", code, *args)


@pytest.fixture(scope="module")
def client_env(wheel, tmp_path_factory) -> ClientEnv:
    base = tmp_path_factory.mktemp("client")
    path = str(base / "venv")
    # --without-pip: this environment's pip installs into it (`pip --python`), which saves
    # ensurepip's seconds; no --system-site-packages, so only what the wheel asks for is there.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True,
                   timeout=120)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python",
                           os.path.join(path, "bin", "python"), "install", "-q",
                           "--disable-pip-version-check", *PIP_TIMEOUT, wheel],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        skip_unless_pip_reaches_an_index(base / "probe")
        pytest.fail("the wheel does not install on its own:\n" + proc.stderr[-2000:])
    return ClientEnv(path)


@pytest.mark.slow          # pip fetches the base requirements from the index
def test_the_client_environment_holds_no_extra(client_env):
    code = ("import importlib.util, json, sys, gpumemctl; print(json.dumps([gpumemctl.__file__,"
            " [m for m in sys.argv[1:] if importlib.util.find_spec(m)]]))")
    proc = client_env.python(code, *EXTRA_MODULES)
    assert proc.returncode == 0, proc.stderr.decode()
    where, present = json.loads(proc.stdout)
    assert where.startswith(client_env.path + os.sep)      # the wheel's copy, not the checkout
    assert present == []


@pytest.mark.slow
def test_the_client_alone_serves_an_application(client_env, daemon):
    """What an application container does: list, read, create and attach, against the
    host's gpumemd (run from the full test environment)."""
    payload = os.urandom(4096)
    daemon.cli("create", "shared/weights", "--size", "1M", check=True)
    daemon.cli("write", "shared/weights", "-", input=payload, check=True)
    sock = ["--socket", daemon.socket]

    listed = client_env.run("gpumemctl", *sock, "ls", "-R", "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    assert "shared/weights" in [e["path"] for e in json.loads(listed.stdout)]
    read = client_env.run("gpumemctl", *sock, "read", "shared/weights", "--length", "4096")
    assert (read.returncode, read.stdout) == (0, payload)
    made = client_env.run("gpumemctl", *sock, "create", "app/scratch", "--size", "64K")
    assert made.returncode == 0, made.stderr.decode()
    assert daemon.cli_json("info", "app/scratch")["capacity"] >= 64 * 1024

    code = ("import sys, gpumemctl\n"
            "with gpumemctl.Client(sys.argv[1]) as c:\n"
            "    c.write('app/scratch', b'from the client')\n"
            "with gpumemctl.attach('shared/weights', 'r', socket=sys.argv[1]) as a:\n"
            "    sys.stdout.buffer.write(a.read(0, 4096))\n")
    attached = client_env.python(code, daemon.socket)
    assert (attached.returncode, attached.stderr) == (0, b"")
    assert attached.stdout == payload
    with daemon.client() as c:
        assert c.read("app/scratch", length=15) == b"from the client"


@pytest.mark.slow
def test_what_needs_an_extra_says_which_in_one_line(client_env):
    top = client_env.run("gpumemctl", "top")
    assert (top.returncode, top.stdout) == (10, b"")
    assert top.stderr.decode() == ("gpumemctl: error: top needs the tui extra (textual is not "
                                   "installed): pip install 'gpumemctl[tui]'\n")
    for args in ([], ["--version"], ["--backend", "host"]):
        gpumemd = client_env.run("gpumemd", *args)
        assert (gpumemd.returncode, gpumemd.stdout) == (1, b""), args
        assert gpumemd.stderr.decode() == (
            "gpumemd: cannot start without the daemon extra (missing: trio, pyfuse3, numpy): "
            "pip install 'gpumemctl[daemon]'\n"), args
    version = client_env.run("gpumemctl", "--version")
    assert (version.returncode, version.stdout) == (0, f"gpumemctl {__version__}\n".encode())
