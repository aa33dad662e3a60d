"""Owners by name (issue 27, item 5) and errors as JSON documents (item 7): `ls -l` shows
`root:root` where the names resolve and numbers where they do not, `ls -n` numbers as
`ls -n` does, `info` names the uid and gid beside the numbers, an error line that names a
uid says whose it is, and with --json an error is also a JSON document on stdout. JSON
keeps the numbers."""
from __future__ import annotations

import json
import os
import pwd

import pytest

from gpumemctl import Client
from tests.users import run_as

STRANGER = 4242          # a uid no passwd entry names (checked below)


def _row(d, *args: str) -> list[str]:
    lines = d.cli("ls", *args, check=True).stdout.decode().splitlines()
    return lines[1].split()


def _make_as_stranger(sock: str) -> bool:
    with Client(sock, timeout=30) as c:
        c.create("pub/theirs", 4096)
    return True


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_ls_long_shows_names_where_they_resolve_and_n_shows_numbers(daemon):
    with pytest.raises(KeyError):
        pwd.getpwuid(STRANGER)
    root_group = __import__("grp").getgrgid(0).gr_name
    daemon.cli("create", "mine", "--size", "4K", check=True)
    assert _row(daemon, "-l", "mine")[1] == f"root:{root_group}"
    assert _row(daemon, "-n", "mine")[1] == "0:0"
    assert _row(daemon, "-l", "-n", "mine")[1] == "0:0"
    entry = daemon.cli_json("ls", "mine")[0]
    assert (entry["uid"], entry["gid"]) == (0, 0)          # numbers in JSON
    daemon.cli("mkdir", "pub", "--mode", "1777", check=True)
    run_as(_make_as_stranger, daemon.socket, uid=STRANGER, gid=STRANGER)
    assert _row(daemon, "-l", "pub/theirs")[1] == f"{STRANGER}:{STRANGER}"
    human = daemon.cli("info", "mine", check=True).stdout.decode()
    assert "uid                0 (root)" in human and f"gid                0 ({root_group})" in \
        human, human


def test_an_error_naming_a_uid_says_whose_it_is(daemon_factory, tmp_path):
    config = tmp_path / "gpumemd.toml"
    config.write_text(f'[quotas]\n{os.geteuid()} = "8M"\n')
    d = daemon_factory(extra_args=["--config", str(config)])
    d.cli("create", "a", "--size", "4M", check=True)
    err = d.cli("create", "b", "--size", "8M", check=7).stderr.decode()
    name = pwd.getpwuid(os.geteuid()).pw_name
    assert err.count("\n") == 1 and err.rstrip().endswith(f"(uid {os.geteuid()} is {name})")


def test_with_json_an_error_is_a_json_document_on_stdout_too(daemon):
    proc = daemon.cli("info", "missing", "--json", check=4)
    doc = json.loads(proc.stdout)
    assert doc["error"]["code"] == 4 and doc["error"]["name"] == "not_found"
    assert "missing" in doc["error"]["message"]
    assert proc.stderr.decode().startswith("gpumemctl: error: ")
    # The global --json too, and a command that failed before reaching the daemon.
    proc = daemon.cli("--json", "resize", "nothing", "--size", "1K", check=4)
    assert json.loads(proc.stdout)["error"]["name"] == "not_found"
    plain = daemon.cli("info", "missing", check=4)
    assert plain.stdout == b""                                # without --json: stderr only
