"""The README's examples, run as a user runs them, against a real gpumemd.

The blocks are read from README.md itself (fenced code blocks, found by the heading above them),
so an example can no longer drift from the code. Only what must be is changed: the socket comes
through $GPUMEMD_SOCKET, `gpumemctl` on PATH is this checkout's, the mount point /mnt/gpumem is
the test's mount, and `events --follow` (which never ends by itself) runs for 2 seconds. Shell
blocks run with `bash -e -o pipefail`, each command's stdout kept apart, so that what the README
claims in a comment (the jq line prints "models/llama") is checked against what it printed.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pwd
import re
import shutil
import subprocess

import pytest

from tests.harness import PYTHON, ROOT, child_env, wait_for

MiB, GiB = 1 << 20, 1 << 30
README = os.path.join(ROOT, "README.md")
MOUNT_IN_README = "/mnt/gpumem"

# Blocks no test here runs, and why. Every other block of the README must be run below
# (test_every_readme_block_is_run_or_excused keeps this list honest).
NOT_RUN = {
    ("Two commands (fresh Debian or Ubuntu, as root)", "sh"):
        "make run / make test: CI runs `make test` itself (.ci/run)",
    ("Install", "sh"): "installs system-wide (pipx, make install, systemctl): tests/ops covers "
                       "make install into a DESTDIR",
    ("The monitor", "sh"): "gpumemctl top needs a terminal: tests/tui/test_tmux.py runs it",
    ("Layout", ""): "a directory listing, not commands",
}
RUN = {  # (heading, language) -> the test that runs it
    ("Talking to it", "sh"): "test_cli_walkthrough",
    ("Talking to it", "python"): "test_python_snippet",
    ("The mount", "sh"): "test_mount_workflow",
    ("ECC, verify and scrub", "sh"): "test_ecc_commands",
    ("Snapshots", "sh"): "test_snapshot_commands",
    ("Model weights", "sh"): "test_model_weights_commands",
    ("Configuration and metrics", "toml"): "test_config_sample",
    ("On a GPU server", "sh"): "test_gpu_server_commands",
    ("On a GPU server", "python"): "test_gpu_server_commands",
}


@dataclasses.dataclass
class Block:
    heading: str        # the nearest `## ` heading above it
    lang: str           # the fence's info string ("" for none)
    code: str


def readme_blocks() -> list[Block]:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks, heading = [], ""
    pattern = r"^## ([^\n]+)$|^```(\w*)\n(.*?)^```$"          # a heading, or a fenced block
    for match in re.finditer(pattern, text, re.MULTILINE | re.DOTALL):
        if match.group(1) is not None:
            heading = match.group(1).strip()
        else:
            blocks.append(Block(heading, match.group(2), match.group(3)))
    return blocks


def readme_block(heading: str, lang: str) -> str:
    found = [b.code for b in readme_blocks() if (b.heading, b.lang) == (heading, lang)]
    assert len(found) == 1, f"README.md: {len(found)} {lang!r} blocks under '## {heading}'"
    return found[0]


def claimed(code: str, command: str, claim: str) -> str:
    """What the README's comment says `command` does: the text after `# CLAIM ` on its line."""
    for line in code.splitlines():
        if line.startswith(command) and f"# {claim} " in line:
            return line.split(f"# {claim} ", 1)[1].strip()
    raise AssertionError(f"README.md: no line starting {command!r} with a '# {claim}' comment")


# ---- running a shell block ---------------------------------------------------------------------
@dataclasses.dataclass
class ShellRun:
    commands: list[str]     # the block's command lines, as the README has them
    stdout: list[str]       # what each one printed

    def output(self, prefix: str) -> str:
        hits = [out for cmd, out in zip(self.commands, self.stdout, strict=True)
                if cmd.startswith(prefix)]
        assert len(hits) == 1, f"{len(hits)} commands start with {prefix!r}"
        return hits[0]


def command_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if line.strip() and not line.startswith("#")]


def bounded(line: str) -> str:
    """A command that runs until Ctrl-C (`events --follow`) runs for 2 s, then counts as done."""
    if "--follow" not in line:
        return line
    command = re.sub(r"\s+#\s.*$", "", line)
    return f"timeout 2 {command} || [ $? -eq 124 ]"


def run_shell(code: str, workdir: str, env: dict, substitute=lambda line: line) -> ShellRun:
    """Run the block's commands in one `bash -e -o pipefail`, in `workdir`, each command's
    stdout into its own file (braces, not a subshell: a `cd` carries on to the next line)."""
    commands = command_lines(code)
    outdir = os.path.join(workdir, ".readme-out")
    os.makedirs(outdir, exist_ok=True)
    script = [f'{{ {bounded(substitute(line))}\n}} > "{outdir}/{i}"'
              for i, line in enumerate(commands)]
    script_path = os.path.join(outdir, "block.sh")
    with open(script_path, "w") as f:
        f.write("\n".join(script) + "\n")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", script_path], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    stdout = []
    for i in range(len(commands)):
        path = os.path.join(outdir, str(i))
        if not os.path.exists(path):
            break
        with open(path, errors="replace") as f:
            stdout.append(f.read())
    if proc.returncode != 0:
        failed = commands[len(stdout) - 1] if stdout else "(none ran)"
        raise AssertionError(f"README command failed with exit {proc.returncode}: {failed}\n"
                             f"stderr:\n{proc.stderr}")
    return ShellRun(commands, stdout)


def user_env(daemon, tmp_path) -> dict:
    """The environment a README reader has: `gpumemctl` on PATH (this checkout's), the socket
    in $GPUMEMD_SOCKET."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "gpumemctl"
    wrapper.write_text("#!/bin/sh\nexec " + PYTHON + " -c 'import sys; from gpumemctl.cli "
                       "import main; sys.exit(main())' \"$@\"\n")
    wrapper.chmod(0o755)
    env = child_env({"GPUMEMD_SOCKET": daemon.socket})
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def workdir(tmp_path) -> str:
    path = tmp_path / "work"
    path.mkdir()
    return str(path)


# ---- the blocks ----------------------------------------------------------------------------
def test_every_readme_block_is_run_or_excused():
    found = {(b.heading, b.lang) for b in readme_blocks()}
    assert found == set(RUN) | set(NOT_RUN), \
        "a README block was added, renamed or removed: run it in this file (RUN) or say " \
        f"why not (NOT_RUN); README has {sorted(found)}"


@pytest.mark.skipif(shutil.which("jq") is None,
                    reason="jq is not installed (scripts/bootstrap.sh test installs it)")
def test_cli_walkthrough(daemon, tmp_path):
    code = readme_block("Talking to it", "sh")
    cwd = workdir(tmp_path)
    run = run_shell(code, cwd, user_env(daemon, tmp_path))

    with open(os.path.join(cwd, "weights.bin"), "rb") as f:
        weights = f.read()
    with open(os.path.join(cwd, "part.bin"), "rb") as f:
        assert f.read() == weights[4096:4096 + MiB]             # --offset 4K --length 1M
    assert "models/llama" in run.output("gpumemctl ls -l -R")
    jq_line = "gpumemctl ls -R --json | jq"
    assert run.output(jq_line).strip() == claimed(code, jq_line, "prints")
    assert "models/llama" in run.output("gpumemctl info")
    assert re.search(r"\bfree of \S+", run.output("gpumemctl status")), \
        "status should show the device's free and total bytes, as the README says"
    assert run.output("gpumemctl check").strip() == "check: clean"
    assert [e["path"] for e in daemon.cli_json("ls", "-R")] == ["models"]    # `rm models/llama`


def test_python_snippet(daemon, tmp_path):
    code = readme_block("Talking to it", "python")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([PYTHON, str(script)], env=user_env(daemon, tmp_path),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    printed = re.search(r"^\s*print\(.*\)\s+#\s*(.+)$", code, re.MULTILINE)
    assert printed, "README.md: the snippet's print() should say in a comment what it prints"
    assert proc.stdout.strip() == printed.group(1).strip()
    # "freed when this session ends": the leased allocation goes with the client
    wait_for(lambda: daemon.cli("info", "scratch/kv").returncode == 4, timeout=10,
             what="the leased allocation to be freed when the session ended")


@pytest.mark.skipif(shutil.which("setfattr") is None,
                    reason="setfattr/getfattr missing (scripts/bootstrap.sh test installs attr)")
@pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                    reason="no FUSE here (/dev/fuse, or fusermount3 from fuse3)")
def test_mount_workflow(daemon_factory, tmp_path):
    mounted = daemon_factory(mount=True, extra_args=["--host-capacity", "1G"])
    code = readme_block("The mount", "sh")
    run = run_shell(code, workdir(tmp_path), user_env(mounted, tmp_path),
                    substitute=lambda line: line.replace(MOUNT_IN_README, mounted.mnt))

    assert 'user.gpu.state="ready"' in run.output("getfattr -n user.gpu.state f")
    info = json.loads(run.output("cat .metadata/f"))
    assert (info["path"], info["size"], info["durable"], info["state"]) == \
        ("f", MiB, True, "ready")
    listed = {line.split()[-1]: line.split() for line in run.output("ls -la").splitlines()
              if len(line.split()) >= 9}
    assert listed["f"][4] == str(4 * MiB)           # dd wrote 4 MiB: the write past the end grew it
    assert [e["path"] for e in mounted.cli_json("ls")] == []             # `rm f`


def test_ecc_commands(daemon, tmp_path):
    # The block refers to the walkthrough's allocation: make it (small: verify reads it all).
    daemon.cli("create", "models/llama", "--size", "8M", "--durable", check=True)
    daemon.cli("write", "models/llama", input=os.urandom(8 * MiB), check=True)
    code = readme_block("ECC, verify and scrub", "sh")
    run = run_shell(code, workdir(tmp_path), user_env(daemon, tmp_path))   # every exit 0: clean
    assert run.output("gpumemctl scrub --wait --quiet") == ""            # quiet when clean
    assert daemon.cli_json("info", "models/llama")["state"] == "ready"


def test_snapshot_commands(daemon, tmp_path):
    data = os.urandom(3 * MiB)
    daemon.cli("create", "models/llama", "--size", "3M", "--durable", check=True)
    daemon.cli("write", "models/llama", input=data, check=True)
    store = str(tmp_path / "snaps")
    code = readme_block("Snapshots", "sh").replace("/var/tmp/snaps", store)
    run_shell(code, workdir(tmp_path), user_env(daemon, tmp_path))       # every exit 0
    assert daemon.cli("read", "copy/models/llama", check=True).stdout == data


def test_model_weights_commands(daemon, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file
    cwd = workdir(tmp_path)
    source = os.path.join(cwd, "model.safetensors")
    save_file({"embed": np.arange(64, dtype=np.float32).reshape(8, 8),
               "head": np.ones(8, dtype=np.float16)}, source)
    env = user_env(daemon, tmp_path)
    os.symlink(PYTHON, tmp_path / "bin" / "python3")    # the reader's Python has gpumemctl
    run = run_shell(readme_block("Model weights", "sh"), cwd, env)
    assert run.output("gpumemctl meta get") == "alice\n"
    with open(source, "rb") as a, open(os.path.join(cwd, "copy.safetensors"), "rb") as b:
        assert a.read() == b.read()
    assert run.output("python3 -c") == "['embed', 'head']\n"
    assert daemon.cli_json("info", "models/tiny")["durable"] is True


def test_config_sample(daemon_factory, tmp_path):
    d = daemon_factory(start=False, mount=True)
    text = readme_block("Configuration and metrics", "toml").replace(MOUNT_IN_README, d.mnt)
    path = tmp_path / "gpumemd.toml"
    path.write_text(text)
    d.extra_args += ["--config", str(path)]
    d.start()
    assert d.mounted()
    status = d.cli_json("status")
    assert status["scrub"]["default_rate"] == 2 * GiB
    quotas = {q["uid"]: q["quota"] for q in status["quotas"]}
    assert quotas == {1000: 16 * GiB, pwd.getpwnam("nobody").pw_uid: 4 * GiB}
    assert d.cli_json("create", "x", "--size", "1M")["ecc"] == "rs"


# ---- the GPU section: only where gpumemd's cuda backend runs (pytest -m gpu) ---------------------
@pytest.mark.gpu
def test_gpu_server_commands(daemon_factory, tmp_path):
    d = daemon_factory(backend="cuda")
    cwd = workdir(tmp_path)
    with open(os.path.join(cwd, "weights.bin"), "wb") as f:      # the README's input file
        f.write(os.urandom(64 * MiB))
    env = user_env(d, tmp_path)
    run_shell(readme_block("On a GPU server", "sh"), cwd, env)
    assert d.cli_json("info", "models/llama")["durable"] is True
    with open(os.path.join(cwd, "weights.bin"), "rb") as f:
        assert d.cli("read", "models/llama", "--length", str(64 * MiB),
                     check=True).stdout == f.read()
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the README's attach() example needs torch")
    script = os.path.join(cwd, "attach.py")
    with open(script, "w") as f:
        f.write(readme_block("On a GPU server", "python"))
    proc = subprocess.run([PYTHON, script], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
