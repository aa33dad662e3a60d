"""Every configuration example the documentation shows starts a real gpumemd (issue 24, item
17: `default_quota = "25%"`, from gpumemd.conf(5)'s example, crashed gpumemd at start with
an AttributeError). The examples: each ```toml block of docs/*.md and README.md, and the
EXAMPLE of gpumemd.conf(5) (scripts/gen-man.py's CONF_EXAMPLE, which the page prints).

Each runs as `gpumemd --config FILE` on the host backend with nothing else on its command
line, and must serve `status` and stop cleanly. What an example names on this machine is
replaced by the test's own temp directory: the values of `socket`, `state_dir`, `mount` (no
mount where FUSE is missing) and `snapshot_dir` (a local one, unless an s3:// one); where an
example leaves `socket` or `state_dir` out they are added at its top. `backend = "auto"`
stays (the host backend here, cuda on the GPU machine). An example marked `(refused)` in
its first line is a mistake shown on purpose: gpumemd must exit 2 with the line the next
fenced block shows first (its path, /etc/gpumemd.toml, read as the test's file)."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import signal
import subprocess

import pytest

from tests.harness import (
    ROOT,
    Daemon,
    child_env,
    fuse_missing,
    make_base_dir,
    script_argv,
)

DOC_PATH = "/etc/gpumemd.toml"       # the path the documented messages name
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PATH_KEYS = ("socket", "state_dir", "mount", "snapshot_dir")


def _man_example() -> str:
    spec = importlib.util.spec_from_file_location(
        "gen_man", os.path.join(ROOT, "scripts", "gen-man.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return "\n".join(module.CONF_EXAMPLE) + "\n"


def examples() -> list:
    """pytest params: (text, expected error line or None), with an id naming the source."""
    params = [pytest.param(_man_example(), None, id="man/gpumemd.conf.5:EXAMPLE")]
    sources = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + \
        [os.path.join(ROOT, "README.md")]
    for source in sources:
        with open(source, encoding="utf-8") as f:
            text = f.read()
        blocks = [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
                  for m in FENCE.finditer(text)]
        for i, (lang, body, line) in enumerate(blocks):
            if lang != "toml":
                continue
            where = f"{os.path.relpath(source, ROOT)}:{line}"
            expected = None
            if "(refused)" in body.split("\n", 1)[0]:
                shown = [b for lang_, b, _ in blocks[i + 1:] if not lang_]
                assert shown, f"{where}: a refused example with no message after it"
                expected = shown[0].split("\n", 1)[0]
            params.append(pytest.param(body, expected, id=where))
    return params


class ConfiguredDaemon(Daemon):
    """gpumemd with `--config FILE` alone on its command line."""

    def __init__(self, base: str, config_path: str, mount: bool):
        super().__init__(base, mount=mount, log_level=None)
        self.config_path = config_path

    def argv(self) -> list[str]:
        return script_argv("gpumemd") + ["--config", self.config_path]


def localised(text: str, d: Daemon, snapshots: str) -> str:
    """The example with its paths replaced by the test's (see the module docstring)."""
    values = {"socket": d.socket, "state_dir": d.state_dir, "mount": d.mnt or "",
              "snapshot_dir": snapshots}
    for key in PATH_KEYS:
        pattern = re.compile(rf'^({key}\s*=\s*)"([^"]*)"', re.MULTILINE)
        text = pattern.sub(lambda m, k=key: m.group(0) if k == "snapshot_dir" and
                           m.group(2).startswith("s3://") else f'{m.group(1)}"{values[k]}"',
                           text)
    top = [f'{key} = "{values[key]}"' for key in ("socket", "state_dir")
           if not re.search(rf"^{key}\s*=", text, re.MULTILINE)]
    return "\n".join(top + [text])


@pytest.fixture
def base():
    path = make_base_dir("gpumemd-config-example-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("text, error", examples())
def test_each_documented_configuration_starts_gpumemd(base, text, error):
    config_path = os.path.join(base, "gpumemd.toml")
    wants_mount = re.search(r'^mount\s*=\s*"[^"]+"', text, re.MULTILINE) is not None
    d = ConfiguredDaemon(base, config_path, mount=wants_mount and not fuse_missing())
    snapshots = os.path.join(base, "snapshots")
    os.makedirs(snapshots, mode=0o700)
    with open(config_path, "w") as f:
        f.write(localised(text, d, snapshots))
    if error is not None:
        proc = subprocess.run(d.argv(), capture_output=True, text=True, env=child_env(),
                              timeout=60)
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        assert proc.stderr.replace(config_path, DOC_PATH).rstrip("\n") == error
        assert not os.path.exists(d.state_dir)           # refused before anything is made
        return
    try:
        d.start(timeout=30)
        status = d.cli_json("status")
        assert status["daemon"] and status["devices"], status
        assert d.stop(signal.SIGTERM) == 0, d.log_tail()
    finally:
        d.cleanup()
    assert "Traceback" not in d.log(), d.log_tail()
