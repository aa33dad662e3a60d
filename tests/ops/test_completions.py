"""The committed completion scripts, sourced in a real bash, zsh and fish.

Each shell finds `gpumemctl` on PATH as a wrapper that runs this interpreter on this checkout,
with GPUMEMD_SOCKET naming the test daemon, exactly as an installed gpumemctl would run.
- bash: source the script, take the function from `complete -p gpumemctl`, set COMP_WORDS /
  COMP_CWORD as readline would, call it and print COMPREPLY.
- zsh: an interactive `zsh -f -i` on a pseudo-terminal loads the script from $fpath through
  compinit (the installed way), with `compadd` wrapped to append every match it adds to a
  file; a TAB typed on the terminal runs the real completion system.
- fish: source the script and ask `complete -C 'gpumemctl cre'`.
"""
from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPLETIONS = os.path.join(ROOT, "completions")
BASH_SCRIPT = os.path.join(COMPLETIONS, "bash", "gpumemctl")
ZSH_DIR = os.path.join(COMPLETIONS, "zsh")
FISH_SCRIPT = os.path.join(COMPLETIONS, "fish", "gpumemctl.fish")


def need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (scripts/bootstrap.sh installs it)")
    return path


@pytest.fixture
def shell_env(tmp_path, daemon):
    """PATH with a `gpumemctl` for this interpreter, and GPUMEMD_SOCKET -> the daemon,
    which holds models/llama, models/mistral, models/tiny/a and scratch."""
    daemon.cli("create", "models/llama", "--size", "1M", check=True)
    daemon.cli("create", "models/mistral", "--size", "2M", "--durable", check=True)
    daemon.cli("create", "models/tiny/a", "--size", "4K", check=True)
    daemon.cli("create", "scratch", "--size", "4K", check=True)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "gpumemctl"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import sys; from gpumemctl.cli "
                       f"import main; sys.exit(main())' \"$@\"\n")
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("_GPUMEMCTL", "COMP_", "ZDOTDIR", "BASH_ENV", "ENV"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               PYTHONPATH=ROOT, GPUMEMD_SOCKET=daemon.socket, HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
               TERM="dumb")
    return env


# ---- bash ------------------------------------------------------------------------------------
BASH_DRIVER = r"""
source "$1"; shift
spec=$(complete -p gpumemctl) || exit 90
func=${spec##*-F }; func=${func%% *}
COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$func" gpumemctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""


def bash_complete(env: dict, *words: str) -> list[str]:
    proc = subprocess.run([need("bash"), "--norc", "--noprofile", "-c", BASH_DRIVER, "bash",
                           BASH_SCRIPT, "gpumemctl", *words], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr          # nothing may leak into the terminal
    return [line for line in proc.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_names(shell_env):
    assert bash_complete(shell_env, "cre") == ["create"]
    assert set(bash_complete(shell_env, "s")) == {"status", "scrub", "snapshot", "save",
                                                  "sleep"}
    assert "--durable" in bash_complete(shell_env, "create", "x", "--d")
    assert bash_complete(shell_env, "rm", "models/l") == ["models/llama"]
    assert set(bash_complete(shell_env, "info", "models/")) == {
        "models/llama", "models/mistral", "models/tiny/"}
    # A lone directory brings its entries, so bash stops at the '/' instead of adding a space
    assert set(bash_complete(shell_env, "verify", "mod")) >= {"models/", "models/llama"}
    assert bash_complete(shell_env, "durable", "models/ti") == ["models/tiny/",
                                                                 "models/tiny/a"]


def test_bash_global_socket_option_is_used_for_names(shell_env, daemon):
    env = dict(shell_env, GPUMEMD_SOCKET="/nonexistent/gpumemd.sock")
    assert bash_complete(env, "rm", "models/l") == []
    assert bash_complete(env, "--socket", daemon.socket, "rm", "models/l") == ["models/llama"]


def test_bash_daemon_down_completes_nothing_quietly(shell_env, daemon):
    daemon.stop()
    assert bash_complete(shell_env, "rm", "models/l") == []     # stderr checked empty too
    assert bash_complete(shell_env, "cre") == ["create"]        # commands need no daemon


# ---- zsh -------------------------------------------------------------------------------------
ZSH_SETUP = r"""
PROMPT='> '; RPROMPT=''; unsetopt zle_bracketed_paste 2>/dev/null
fpath=({zsh_dir} $fpath)
autoload -Uz compinit && compinit -u -D
# calls that only compute (-O/-A/-D) go straight through; the others also record
compadd() {{
    if [[ ${{@[1,(i)(-|--)]}} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi
    local -a __hits; builtin compadd -A __hits "$@"
    builtin compadd "$@"; local ret=$?
    (( $#__hits )) && print -rl -- $__hits >> {out}
    return ret
}}
print -r -- READY > {ready}
"""


def zsh_complete(env: dict, tmp_path, line: str, expect_any: bool = True) -> list[str]:
    """Type `line` and a TAB into an interactive zsh; return the matches it offered."""
    zsh = need("zsh")
    out, ready = tmp_path / "zsh-matches", tmp_path / "zsh-ready"
    for f in (out, ready):
        f.unlink(missing_ok=True)
    master, slave = pty.openpty()
    proc = subprocess.Popen([zsh, "-f", "-i"], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True, close_fds=True)
    os.close(slave)
    transcript = bytearray()

    def pump(until, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until():
                return True
            if select.select([master], [], [], 0.05)[0]:
                try:
                    transcript.extend(os.read(master, 65536))
                except OSError:
                    break
        return until()

    try:
        setup = tmp_path / "zsh-setup"
        setup.write_text(ZSH_SETUP.format(zsh_dir=ZSH_DIR, out=out, ready=ready))
        os.write(master, f"source {setup}\n".encode())
        assert pump(ready.exists, 30), f"zsh did not start:\n{transcript.decode(errors='replace')}"
        os.write(master, line.encode() + b"\t")
        # Completion runs gpumemctl (a Python start) once or twice; then the matches are in.
        got = pump(lambda: out.exists() and out.stat().st_size > 0, 30 if expect_any else 5)
        pump(lambda: False, 0.5)                       # let a second compadd call land
        assert got or not expect_any, \
            f"no zsh completion for {line!r}:\n{transcript.decode(errors='replace')}"
        text = out.read_text() if out.exists() else ""
    finally:
        proc.kill()
        proc.wait(10)
        os.close(master)
    assert "Traceback" not in transcript.decode(errors="replace")
    return sorted(set(text.split("\n")) - {""})


def test_zsh_completes_commands_and_names(shell_env, tmp_path):
    assert zsh_complete(shell_env, tmp_path, "gpumemctl cre") == ["create"]
    assert zsh_complete(shell_env, tmp_path, "gpumemctl rm models/l") == ["models/llama"]
    assert zsh_complete(shell_env, tmp_path, "gpumemctl info models/m") == ["models/mistral"]


def test_zsh_daemon_down_completes_nothing(shell_env, tmp_path, daemon):
    daemon.stop()
    assert zsh_complete(shell_env, tmp_path, "gpumemctl rm models/l", expect_any=False) == []


# ---- fish ------------------------------------------------------------------------------------
def fish_complete(env: dict, line: str) -> list[str]:
    fish = need("fish")
    proc = subprocess.run([fish, "--no-config", "-c",
                           f"source {FISH_SCRIPT}; complete -C {line!r}"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    return [row.split("\t")[0] for row in proc.stdout.splitlines() if row]


def test_fish_completes_commands_and_names(shell_env):
    assert fish_complete(shell_env, "gpumemctl cre") == ["create"]
    assert fish_complete(shell_env, "gpumemctl rm models/l") == ["models/llama"]
    assert "--durable" in fish_complete(shell_env, "gpumemctl create x --d")


def test_fish_daemon_down_completes_nothing(shell_env, daemon):
    daemon.stop()
    assert fish_complete(shell_env, "gpumemctl rm models/l") == []
