"""Generated files stay generated: completions and man pages match their generators, the man
pages lint clean and publish every exit code, the systemd units verify, `make install` puts
everything where the system looks for it."""
from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys

import pytest

from gpumemctl.protocol.errors import ERROR_TABLE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAN_PAGES = ["gpumemctl.1", "gpumemd.8", "gpumemd.conf.5"]
UNITS = ["gpumemd.service", "gpumemd-scrub.service", "gpumemd-scrub.timer"]


def run_generator(script: str, outdir) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), str(outdir)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


def differing(generated, committed) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(generated):
        for name in files:
            new = os.path.join(dirpath, name)
            old = os.path.join(committed, os.path.relpath(new, generated))
            if not os.path.exists(old) or not filecmp.cmp(new, old, shallow=False):
                out.append(os.path.relpath(new, generated))
    return sorted(out)


@pytest.mark.parametrize("script,directory", [("gen-completions.py", "completions"),
                                              ("gen-man.py", "man")])
def test_committed_files_are_what_the_generator_writes(tmp_path, script, directory):
    run_generator(script, tmp_path)
    stale = differing(tmp_path, os.path.join(ROOT, directory))
    assert not stale, (f"{directory}/ is stale: {stale}; run `make generated` "
                       f"(python scripts/{script} {directory}) and commit")
    extra = sorted(set(os.listdir(os.path.join(ROOT, directory))) - set(os.listdir(tmp_path)))
    assert not extra, f"{directory}/ holds files no generator writes: {extra}"


@pytest.mark.parametrize("page", MAN_PAGES)
def test_man_page_lints_clean(page):
    path = os.path.join(ROOT, "man", page)
    linters = []
    if shutil.which("mandoc"):
        linters.append(["mandoc", "-T", "lint", "-W", "warning", path])
    if shutil.which("groff"):
        linters.append(["groff", "-ww", "-z", "-man", path])
    if not linters:
        pytest.skip("neither mandoc nor groff is installed (scripts/bootstrap.sh installs "
                    "mandoc)")
    for cmd in linters:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stdout + proc.stderr) == (0, ""), \
            f"{cmd[0]} on {page}:\n{proc.stdout}{proc.stderr}"


def _section(text: str, name: str) -> str:
    match = re.search(rf"^\.SH {name}\n(.*?)(?=^\.SH |\Z)", text, re.S | re.M)
    assert match, f"no {name} section"
    return match.group(1)


def test_gpumemctl_man_page_lists_every_exit_code_and_command():
    import typer

    from gpumemctl.cli import app
    text = open(os.path.join(ROOT, "man", "gpumemctl.1")).read()
    exit_status = _section(text, "EXIT STATUS")
    for code, (name, _meaning) in ERROR_TABLE.items():
        assert re.search(rf"^\\fB{code}\\fR \({re.escape(name)}\)$", exit_status, re.M), \
            f"exit code {code} ({name}) missing from EXIT STATUS"
    commands = _section(text, "COMMANDS")
    for name in typer.main.get_command(app).commands:
        assert re.search(rf"^\.SS \\fBgpumemctl {name}\b", commands, re.M), name
    examples = _section(text, "EXAMPLES")
    assert "gpumemctl scrub \\-\\-wait \\-\\-quiet" in examples
    assert "gpumemctl verify \\-\\-all \\-\\-quiet" in examples


def test_gpumemd_man_page_has_every_option():
    from daemon.main import build_parser
    text = open(os.path.join(ROOT, "man", "gpumemd.8")).read()
    options = _section(text, "OPTIONS")
    for action in build_parser()._actions:
        for opt in action.option_strings:
            roff = re.sub(r"(?<!\w)-", r"\\-", opt)        # --state-dir: \-\-state-dir
            assert "\\fB" + roff + "\\fR" in options, opt
    for name in ("SIGNALS", "DURABILITY", "THE KEEPER", "SYSTEMD"):
        _section(text, name)
    assert "gpumemd.conf(5)" in _section(text, "SEE ALSO")
    assert "gpumemd.conf(5)" in options          # the --config option's text


def _unroff(text: str) -> str:
    """The plain text of no-fill roff lines as gen-man.py writes them."""
    text = re.sub(r"\\f[BIR]", "", text)
    return text.replace("\\&", "").replace("\\-", "-").replace("\\e", "\\")


def test_config_man_page_has_every_key_and_section():
    from daemon import config
    text = open(os.path.join(ROOT, "man", "gpumemd.conf.5")).read()
    assert re.search(r"^\.TH GPUMEMD\.CONF 5 ", text, re.M)
    for name in ("NAME", "SYNOPSIS", "DESCRIPTION", "KEYS", "QUOTAS", "EXAMPLE", "FILES"):
        _section(text, name)
    synopsis = _unroff(_section(text, "SYNOPSIS"))
    for where in ("/etc/gpumemd.toml", "$XDG_CONFIG_HOME/gpumemd.toml", "$GPUMEMD_CONFIG",
                  "gpumemd --config FILE"):
        assert where in synopsis, where
    keys = _section(text, "KEYS")
    for key in config.KEYS:
        # the tag: name and type, then its default and the option that overrides it
        match = re.search(rf"^\.TP\n\\fB{re.escape(key.name)}\\fR = \\fI{key.type}\\fR\n"
                          rf"(.*?)(?=^\.TP|\Z)", keys, re.M | re.S)
        assert match, f"key {key.name} missing from KEYS"
        body = " ".join(_unroff(match.group(1)).split())
        assert f"Default: {' '.join(key.default.split())}." in body, key.name
        assert (f"Option: {key.option} " in body) if key.option else "Option: none" in body
    quotas = _unroff(_section(text, "QUOTAS"))
    assert "exit status 7" in quotas and "EDQUOT" in quotas
    assert "Root is not exempt" in quotas
    see_also = _section(text, "SEE ALSO")
    assert "gpumemd(8)" in see_also and "gpumemctl(1)" in see_also


def test_config_man_page_example_is_a_valid_config_file(tmp_path):
    from daemon import config
    text = open(os.path.join(ROOT, "man", "gpumemd.conf.5")).read()
    block = re.search(r"^\.nf\n\.RS 4\n(.*?)^\.RE\n\.fi", _section(text, "EXAMPLE"),
                      re.M | re.S)
    assert block, "no example block in EXAMPLE"
    path = tmp_path / "gpumemd.toml"
    path.write_text(_unroff(block.group(1)))
    loaded = config.load(str(path))             # raises ConfigError on any problem
    assert loaded.path == str(path)
    # a complete file: every key of the table is set
    unset = [k.name for k in config.KEYS if getattr(loaded, k.name) in (None, {}, [])]
    assert not unset, f"the EXAMPLE leaves out {unset}"


def _systemd_version() -> int:
    out = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True)
    match = re.search(r"systemd (\d+)", out.stdout)
    return int(match.group(1)) if match else 0


def test_systemd_units_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (package systemd)")
    # ExecStart= binaries must exist for verify: stand-ins in a temporary bin directory.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for prog in ("gpumemd", "gpumemctl"):
        (bindir / prog).write_text("#!/bin/sh\n")
        (bindir / prog).chmod(0o755)
    for unit in UNITS:
        text = open(os.path.join(ROOT, "systemd", unit)).read()
        (tmp_path / unit).write_text(text.replace("/usr/bin/gpumem", f"{bindir}/gpumem"))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *UNITS], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SYSTEMD_LOG_LEVEL="notice"))
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if _systemd_version() < 254:     # the key arrived in 254; older ones ignore it, and say so
        lines = [line for line in lines
                 if "Unknown key 'FileDescriptorStorePreserve'" not in line
                 and "Unknown key name 'FileDescriptorStorePreserve'" not in line]
    assert proc.returncode == 0 and not lines, "\n".join(lines)


def test_service_unit_matches_the_durability_model():
    text = open(os.path.join(ROOT, "systemd", "gpumemd.service")).read()
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert int(settings["FileDescriptorStoreMax"]) >= 1024
    assert settings["FileDescriptorStorePreserve"] == "yes"
    # Any of these gives the service its own mount namespace: the FUSE mount would be
    # invisible to the host.
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ReadWritePaths", "PrivateMounts", "ProtectKernelTunables"):
        assert key not in settings, key
    timer = open(os.path.join(ROOT, "systemd", "gpumemd-scrub.timer")).read()
    assert "Persistent=true" in timer and "OnCalendar=monthly" in timer
    scrub = open(os.path.join(ROOT, "systemd", "gpumemd-scrub.service")).read()
    assert "gpumemctl scrub --wait --quiet" in scrub


def test_make_install_puts_files_in_the_standard_places(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dest = tmp_path / "dest"
    proc = subprocess.run(["make", "-s", "install", f"DESTDIR={dest}", "PREFIX=/usr",
                           "BINDIR=/opt/gpumem/bin"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expect = {"usr/share/bash-completion/completions/gpumemctl": "completions/bash/gpumemctl",
              "usr/share/zsh/site-functions/_gpumemctl": "completions/zsh/_gpumemctl",
              "usr/share/fish/vendor_completions.d/gpumemctl.fish":
                  "completions/fish/gpumemctl.fish",
              "usr/share/man/man1/gpumemctl.1": "man/gpumemctl.1",
              "usr/share/man/man8/gpumemd.8": "man/gpumemd.8",
              "usr/share/man/man5/gpumemd.conf.5": "man/gpumemd.conf.5"}
    for installed, source in expect.items():
        assert filecmp.cmp(dest / installed, os.path.join(ROOT, source), shallow=False)
    unit = (dest / "usr/lib/systemd/system/gpumemd.service").read_text()
    assert "ExecStart=/opt/gpumem/bin/gpumemd " in unit and "/usr/bin/gpumemd" not in unit
    assert (dest / "usr/lib/systemd/system/gpumemd-scrub.timer").exists()
    subprocess.run(["make", "-s", "uninstall", f"DESTDIR={dest}", "PREFIX=/usr"], cwd=ROOT,
                   check=True, capture_output=True, timeout=60)
    assert [f for _d, _s, fs in os.walk(dest) for f in fs] == []
