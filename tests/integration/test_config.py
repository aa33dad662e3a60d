"""gpumemd's configuration file (daemon/config.py, docs/config.md) on a real daemon: bad files
stop it at start with one line and exit 2, good ones set what they say, and the command line
wins over the file."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from daemon import config
from tests.harness import child_env, kill_keeper, script_argv, wait_for

MiB = 1 << 20


def write_config(base, text: str) -> str:
    path = os.path.join(str(base), "gpumemd.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run_gpumemd(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(script_argv("gpumemd") + list(args), capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


def one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpumemd: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_unknown_key_exits_2_before_touching_anything(tmp_path):
    state = tmp_path / "state"
    path = write_config(tmp_path, f'state_dir = "{state}"\nbackend = "host"\n'
                                  'sokcet = "/tmp/x.sock"\n')
    err = one_line(run_gpumemd("--config", path))
    assert "unknown key 'sokcet'" in err and "did you mean 'socket'?" in err
    for name in config.KEY_NAMES:          # the allowed keys are listed
        assert name in err
    assert not state.exists()              # nothing was created


@pytest.mark.parametrize("line, where, shown", [
    ('ecc = "fancy"', "'ecc'", "'fancy'"),
    ('backend = "gpu"', "'backend'", "'gpu'"),
    ('scrub_rate = "fast"', "'scrub_rate'", "'fast'"),
    ('host_capacity = "12XB"', "'host_capacity'", "'12XB'"),
    ('log_level = "loud"', "'log_level'", "'loud'"),
    ('mount = "relative/dir"', "'mount'", "'relative/dir'"),
    ('socket = 5', "'socket'", "5"),
    ('[quotas]\nno_such_user_xyz = "1G"', "'quotas.no_such_user_xyz'", "'1G'"),
    ('[quotas]\n1000 = "lots"', "'quotas.1000'", "'lots'"),
])
def test_bad_value_exits_2_naming_key_and_value(tmp_path, line, where, shown):
    state = tmp_path / "state"
    path = write_config(tmp_path, f'state_dir = "{state}"\n{line}\n')
    err = one_line(run_gpumemd("--config", path))
    assert f"bad value for {where}: {shown}: " in err
    assert "expected" in err or "neither a uid nor a user name" in err
    assert not state.exists()


def test_broken_toml_names_line_and_column(tmp_path):
    path = write_config(tmp_path, 'backend = "host"\necc = "rs\nsocket = "/x"\n')
    err = one_line(run_gpumemd("--config", path))
    assert "invalid TOML" in err and "line 2" in err and "column" in err


def test_missing_config_named_on_the_command_line(tmp_path):
    err = one_line(run_gpumemd("--config", str(tmp_path / "nope.toml")))
    assert "nope.toml: no such configuration file" in err


class Gpumemd:
    """gpumemd started with exactly the arguments given (no --socket/--state-dir added)."""

    def __init__(self, base, *args: str):
        self.log_path = os.path.join(str(base), f"gpumemd-{len(os.listdir(base))}.log")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(script_argv("gpumemd") + list(args), stdout=log,
                                         stderr=log, env=child_env())

    def serving(self, socket_path: str) -> None:
        def ready():
            assert self.proc.poll() is None, self.log()
            return os.path.exists(socket_path)
        wait_for(ready, 15, what=f"gpumemd to serve {socket_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()


def cli(socket_path: str, *args: str, check: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(script_argv("gpumemctl") + ["--socket", socket_path, *args],
                          capture_output=True, env=child_env(), timeout=60)
    assert proc.returncode == check, proc.stderr
    return proc


def test_file_values_apply_and_the_command_line_wins(tmp_path, request):
    file_socket = str(tmp_path / "file.sock")
    path = write_config(tmp_path, f'backend = "host"\nsocket = "{file_socket}"\n'
                                  f'state_dir = "{tmp_path / "state"}"\n'
                                  'host_capacity = "64M"\nlog_level = "warning"\n')
    d = Gpumemd(tmp_path, "--config", path)
    request.addfinalizer(lambda: kill_keeper(str(tmp_path / "state")))  # both runs share it
    try:
        d.serving(file_socket)             # the socket the file names, no --socket given
        dev = __import__("json").loads(cli(file_socket, "devices", "--json").stdout)[0]
        assert dev["total"] == 64 * MiB    # host_capacity from the file
    finally:
        d.stop()
    assert " INFO: " not in d.log()        # log_level = "warning" from the file

    other = str(tmp_path / "cli.sock")
    d = Gpumemd(tmp_path, "--config", path, "--socket", other, "--log-level", "info",
                "--host-capacity", "32M")
    try:
        d.serving(other)
        assert not os.path.exists(file_socket)
        dev = __import__("json").loads(cli(other, "devices", "--json").stdout)[0]
        assert dev["total"] == 32 * MiB
    finally:
        d.stop()
    assert " INFO: configuration read from " in d.log()


def test_default_ecc_comes_from_the_daemon(daemon_factory, tmp_path):
    path = write_config(tmp_path, 'ecc = "none"\n')
    d = daemon_factory(extra_args=["--config", path])
    d.cli("create", "plain", "--size", "1M", check=True)      # no --ecc: the daemon decides
    d.cli("create", "guarded", "--size", "1M", "--ecc", "rs", check=True)
    assert d.cli_json("info", "plain")["ecc"] == "none"
    assert d.cli_json("info", "guarded")["ecc"] == "rs"
    with d.client() as c:                                    # the library leaves it out too
        assert c.create("lib", MiB)["ecc"] == "none"


def test_default_ecc_without_a_config_is_rs(daemon):
    daemon.cli("create", "x", "--size", "1M", check=True)
    assert daemon.cli_json("info", "x")["ecc"] == "rs"


def test_scrub_rate_from_the_config_limits_a_scrub_without_rate(daemon_factory, tmp_path):
    path = write_config(tmp_path, 'scrub_rate = "200M"\n')
    d = daemon_factory(extra_args=["--config", path])
    d.cli("create", "x", "--size", "1M", check=True)
    st = d.cli_json("scrub")
    assert st["rate"] == 200 * MiB
    # That scrub may still be running on a loaded machine; a second start would be refused.
    wait_for(lambda: not d.cli_json("scrub", "status")["running"], timeout=30,
             what="the first scrub to finish")
    d.cli("scrub", "--wait", check=True)
    assert d.cli_json("status")["scrub"]["default_rate"] == 200 * MiB


# ---- quotas (daemon/core/quotas.py) ------------------------------------------------------------
def quota_config(tmp_path, limit: str = "8M") -> str:
    return write_config(tmp_path, f'[quotas]\n{os.geteuid()} = "{limit}"\n')


def test_quota_create_fails_with_exit_7_naming_uid_and_quota(daemon_factory, tmp_path):
    uid = os.geteuid()
    d = daemon_factory(extra_args=["--config", quota_config(tmp_path)])
    d.cli("create", "a", "--size", "4M", check=True)
    err = d.cli("create", "b", "--size", "8M", check=7).stderr.decode()
    assert err.count("\n") == 1
    assert f"quota exceeded for uid {uid}: 8 MiB quota, 4 MiB used, 8 MiB requested" in err
    assert d.cli("info", "b", check=4)                       # nothing was made
    # Parity is not counted: 4M of rs data plus 4M more fit exactly in 8M.
    d.cli("create", "c", "--size", "4M", check=True)
    d.cli("create", "d", "--size", "1", check=7)
    quotas = d.cli_json("status")["quotas"]
    assert quotas == [{"uid": uid, "quota": 8 * MiB, "used": 8 * MiB}]
    d.cli("rm", "c", check=True)                             # freeing gives room back
    d.cli("create", "d", "--size", "2M", check=True)


def test_quota_by_user_name_and_other_uids_unaffected(daemon_factory, tmp_path):
    import pwd
    me = pwd.getpwuid(os.geteuid()).pw_name
    path = write_config(tmp_path, f'[quotas]\n{me} = "2M"\n"4242" = "1G"\n')
    d = daemon_factory(extra_args=["--config", path])
    d.cli("create", "a", "--size", "2M", check=True)
    assert "2 MiB quota" in d.cli("create", "b", "--size", "1", check=7).stderr.decode()
