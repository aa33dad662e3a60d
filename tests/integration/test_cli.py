"""The CLI as scripts use it: exit codes, --json, one-line errors, and bad input that leaves
the daemon serving."""
from __future__ import annotations

import json
import os

import pytest

from tests.sizes import with_parity

MiB = 1 << 20


def one_line_error(proc) -> str:
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("gpumemctl: error: "), err
    assert "Traceback" not in err
    return err


def assert_still_serving(daemon):
    daemon.cli("create", "canary", "--size", "1M", check=True)
    daemon.cli("write", "canary", input=b"ok", check=True)
    assert daemon.cli("read", "canary", "--length", "2", check=True).stdout == b"ok"
    daemon.cli("rm", "canary", check=True)


@pytest.mark.parametrize("name", ["..", "", "a/../b", "x\x01/..", "a" * 256, "d/" * 2500 + "x"])
def test_bad_names_are_usage_errors(daemon, name):
    proc = daemon.cli("create", name, "--size", "1M", check=2)
    assert "invalid name" in one_line_error(proc)


def test_name_with_nul_is_refused(daemon):
    # argv cannot carry NUL, so this goes through the client library.
    from gpumemctl.protocol import UsageError
    with daemon.client() as c, pytest.raises(UsageError, match="NUL"):
        c.create("a\0b", MiB)
    assert_still_serving(daemon)


@pytest.mark.parametrize("size", ["abc", "-1", "0", "1e99", "12XB", "1.3K", ""])
def test_bad_sizes_are_usage_errors(daemon, size):
    proc = daemon.cli("create", "x", "--size", size, check=2)
    err = proc.stderr.decode()
    assert "size" in err and "Traceback" not in err
    assert daemon.cli("info", "x", check=4)
    assert_still_serving(daemon)


def test_duplicate_create_and_missing_rm(daemon):
    daemon.cli("create", "dup", "--size", "1M", check=True)
    assert "already exists" in one_line_error(daemon.cli("create", "dup", "--size", "1M",
                                                         check=5))
    assert "no such" in one_line_error(daemon.cli("rm", "missing", check=4))
    # exist-ok is idempotent for the same size, and still an error for another size
    daemon.cli("create", "dup", "--size", "1M", "--exist-ok", check=True)
    daemon.cli("create", "dup", "--size", "2M", "--exist-ok", check=5)
    assert_still_serving(daemon)


def test_rm_many_reports_each_and_exits_with_first_error(daemon):
    daemon.cli("create", "a", "--size", "1M", check=True)
    daemon.cli("create", "b", "--size", "1M", check=True)
    proc = daemon.cli("rm", "a", "nope", "b", "--json", check=4)
    results = json.loads(proc.stdout)
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["error"]["code"] == 4
    assert daemon.cli_json("ls") == []


def test_out_of_memory_exit_7(daemon_factory):
    d = daemon_factory(extra_args=["--host-capacity", "64M"])
    d.cli("create", "a", "--size", "40M", check=True)
    err = one_line_error(d.cli("create", "b", "--size", "40M", check=7))
    free = 64 * MiB - with_parity(40 * MiB)          # ECC parity counts too
    assert "out of memory on device 0" in err and str(free) in err
    assert_still_serving(d)


def test_not_running_exit_3(tmp_path):
    from tests.harness import Daemon
    d = Daemon(str(tmp_path))
    proc = d.cli("ls", check=3)
    assert "not running" in one_line_error(proc)


def test_usage_error_from_typer_is_2(daemon):
    assert daemon.cli("create", "x", check=2).returncode == 2      # --size missing
    assert daemon.cli("frobnicate", check=2).returncode == 2


@pytest.mark.slabs_off     # the keeper holds one entry per allocation (no parity arena)
def test_json_everywhere(daemon):
    info = daemon.cli_json("create", "m/a", "--size", "1.5M", "--durable", "--mode", "0640")
    assert info["mode"] == "0640" and info["size"] == 1536 * 1024 and info["durable"]
    assert daemon.cli_json("info", "m/a")["holders"] == []
    assert [e["path"] for e in daemon.cli_json("ls", "m")] == ["m/a"]
    assert daemon.cli_json("transient", "m/a")[0]["result"]["durable"] is False
    assert daemon.cli_json("durable", "m/a")[0]["result"]["durable"] is True
    status = daemon.cli_json("status")
    assert status["totals"]["allocations"] == 1 and status["keeper"]["held"] == 1
    assert status["daemon"]["backend"] == "host"
    assert daemon.cli_json("devices")[0]["ours"] == with_parity(2 * MiB)
    kinds = [e["kind"] for e in daemon.cli_json("events")]
    assert kinds[-3:] == ["create", "transient", "durable"]
    assert daemon.cli_json("check")["clean"] is True
    written = json.loads(daemon.cli("--json", "write", "m/a", input=b"xyz", check=True).stdout)
    assert written == {"bytes": 3, "name": "m/a", "offset": 0}
    assert [r["ok"] for r in daemon.cli_json("rm", "-r", "m")] == [True]


def test_write_read_offsets_and_files(daemon, tmp_path):
    daemon.cli("create", "f", "--size", "5M", check=True)
    payload = os.urandom(3 * MiB + 17)
    src = tmp_path / "in.bin"
    src.write_bytes(payload)
    daemon.cli("write", "f", str(src), "--offset", "1M", check=True)
    dst = tmp_path / "out.bin"
    daemon.cli("read", "f", str(dst), "--offset", "1M", "--length", str(len(payload)),
               check=True)
    assert dst.read_bytes() == payload
    whole = daemon.cli("read", "f", check=True).stdout
    assert len(whole) == 5 * MiB and whole[:MiB] == bytes(MiB)
    # Past the end: refused before anything is written, named clearly.
    err = one_line_error(daemon.cli("write", "f", str(src), "--offset", "3M", check=2))
    assert "outside" in err or "larger" in err
    assert daemon.cli("read", "f", "--offset", "3M", "--length", "4", check=True).stdout == \
        payload[2 * MiB:2 * MiB + 4]
    # Streaming from stdin that is too long: nothing past the end, the head is written.
    one_line_error(daemon.cli("write", "f", "--offset", "5M", input=b"x", check=2))


def test_read_of_directory_and_busy_writer(daemon):
    daemon.cli("create", "d/x", "--size", "1M", check=True)
    assert "directory" in one_line_error(daemon.cli("read", "d", check=2))
    with daemon.client() as c:
        with c.open("d/x", "rw"):
            err = one_line_error(daemon.cli("read", "d/x", check=9))
            assert "locked" in err
            assert "busy" in one_line_error(daemon.cli("rm", "d/x", check=9))
            daemon.cli("rm", "--force", "d/x", check=True)
    assert daemon.cli_json("ls", "d") == []


def test_cli_does_not_import_heavy_modules(daemon):
    """`gpumemctl ls` must start fast: a real run imports no textual, cuda, pynvml, numpy,
    pydantic or rich (typer 0.26+ pulls pydantic in: ~150 ms per start)."""
    import subprocess
    import sys
    code = ("import sys; sys.argv = ['gpumemctl', '--socket', sys.argv[1], 'ls', '--json']\n"
            "from gpumemctl.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'cuda', 'pynvml',"
            " 'trio', 'daemon', 'numpy', 'pydantic', 'rich')]\n"
            "sys.stderr.write(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code, daemon.socket], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert proc.returncode == 0, f"heavy modules imported by the CLI: {proc.stderr}"
    assert proc.stdout.strip() == "[]"
