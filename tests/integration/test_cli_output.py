"""What a person reads from gpumemctl, against a real daemon: usage errors in one line,
help for every argument, no Python `None` in any command's human output, and the damage a
verify finds recorded for `info`, `ls -l` and reads. And what a script's loop pays: a plain
`gpumemctl ls --json` loads neither typer, click nor rich."""
from __future__ import annotations

import re
import subprocess
import sys

import click
import numpy as np
import pytest

from tests.harness import ROOT, child_env, script_argv
from tests.harness import store_random as make

MiB, BLOCK = 1 << 20, 128 * 1024


@pytest.fixture(scope="module")
def command_tree() -> click.Group:
    from gpumemctl.cli.typerapp import build_command
    return build_command()


def leaf_commands(group: click.Group, prefix: tuple = ()) -> set[tuple[str, ...]]:
    """Every command a person can run, as its words: ("ls",), ("scrub", "status"), ..."""
    found: set[tuple[str, ...]] = set()
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found |= leaf_commands(cmd, prefix + (name,))
            if cmd.invoke_without_command:           # bare `gpumemctl scrub` runs too
                found.add(prefix + (name,))
        else:
            found.add(prefix + (name,))
    return found


# ---- usage errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message, hint", [
    (["frobnicate"], "no such command 'frobnicate'", "Try 'gpumemctl -h' for help."),
    (["lss"], "no such command 'lss'; did you mean 'ls'?", "Try 'gpumemctl -h' for help."),
    (["creat"], "no such command 'creat'; did you mean 'create' or 'read'?",
     "Try 'gpumemctl -h' for help."),
    (["ls", "--bogus"], "no such option '--bogus'; did you mean '--long'?",
     "Try 'gpumemctl ls -h' for help."),
    (["create", "x"], "missing option '--size' / '-s'", "Try 'gpumemctl create -h' for help."),
    (["info"], "missing argument 'NAME'", "Try 'gpumemctl info -h' for help."),
    (["ls", "a", "b"], "got unexpected extra argument (b)", "Try 'gpumemctl ls -h' for help."),
    (["events", "--since", "soon"],
     "invalid value for '--since': 'soon' is not a valid integer",
     "Try 'gpumemctl events -h' for help."),
    (["scrub", "stat"], "no such command 'stat'; did you mean 'start' or 'status'?",
     "Try 'gpumemctl scrub -h' for help."),
    (["create", "x", "--size", "12Q"], "invalid size '12Q': expected a whole number of bytes",
     None),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_usage_error_is_one_line_and_where_help_is(daemon, argv, message, hint):
    proc = daemon.cli(*argv, check=2)
    lines = proc.stderr.decode().splitlines()
    assert lines[0].startswith(f"gpumemctl: error: {message}"), lines
    assert lines[1:] == ([hint] if hint else []), lines
    assert proc.stdout == b""


def test_a_near_miss_is_suggested_once(daemon):
    for typo in ("lss", "creat", "staus"):
        err = daemon.cli(typo, check=2).stderr.decode()
        assert err.lower().count("did you mean") == 1, err


# ---- help -------------------------------------------------------------------------------------
def arguments(cmd: click.Command) -> list[click.Argument]:
    return [p for p in cmd.params if isinstance(p, click.Argument)]


def find(group: click.Group, words: tuple[str, ...]) -> click.Command:
    cmd = group
    for word in words:
        cmd = cmd.commands[word]
    return cmd


def test_every_argument_has_help_text(command_tree):
    missing = [" ".join(words) + " " + p.name.upper()
               for words in sorted(leaf_commands(command_tree))
               for p in arguments(find(command_tree, words)) if not (p.help or "").strip()]
    assert missing == []


def test_help_shows_every_arguments_text(daemon, command_tree):
    for words in sorted(leaf_commands(command_tree)):
        params = arguments(find(command_tree, words))
        if not params:
            continue
        shown = daemon.cli(*words, "-h", check=0).stdout.decode()
        # The help is drawn in boxes and wrapped: compare the words only.
        flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", shown).split())
        for p in params:
            assert " ".join(p.help.split()) in flat, (words, p.name, shown)


# ---- no Python None in what people read -------------------------------------------------------


# Every command, in an order that gives each something to show: allocations never verified,
# verified, degraded, a directory, a scrub before, during and after, events of all of it.
HUMAN_RUNS = [
    ("info", "models/clean"), ("ls",), ("ls", "-l"), ("ls", "-R"), ("ls", "-l", "-R"),
    ("ls", "-lR", "models"), ("status",), ("devices",), ("scrub", "status"),
    ("verify", "models/clean"), ("info", "models/clean"),
    ("debug", "corrupt", "models/bad", "--offset", "0", "--length", str(BLOCK),
     "--pattern", "5a"),
    ("debug", "corrupt", "models/fixable", "--offset", "100", "--length", "10"),
    ("debug", "gpu-event", "--device", "0", "--remap"), ("devices",), ("status",),
    ("verify", "models/fixable"), ("info", "models/fixable"), ("verify", "--all", "--repair"),
    ("info", "models/bad"), ("info", "models"), ("recover", "models/bad"),
    ("scrub", "start", "--wait"), ("scrub", "status"), ("scrub",), ("scrub", "stop"),
    ("scrub", "status"), ("check",), ("metrics",), ("doctor",), ("events", "-n", "1000"),
    ("compact", "--dry-run"), ("compact",),
    ("mkdir", "extra"), ("create", "extra/x", "--size", "1M"), ("write", "extra/x", "IN"),
    ("read", "extra/x", "OUT"), ("sleep", "extra/x"), ("ls", "-l", "extra"), ("sleep", "extra/x"),
    ("wake", "extra/x"), ("wake", "extra/x"), ("durable", "extra/x"), ("transient", "extra/x"),
    ("revoke", "extra/x"), ("meta", "set", "extra/x", "k", "v"), ("meta", "ls", "extra/x"),
    ("meta", "get", "extra/x", "k"), ("info", "extra/x"), ("meta", "rm", "extra/x", "k"),
    ("ln", "-s", "x", "extra/link"), ("ls", "-l", "extra"),
    ("resize", "extra/x", "--size", "2M"), ("mv", "extra/x", "extra/y"), ("mv", "extra/y",
                                                                              "extra/x"),
    ("info", "extra/link"), ("ln", "x", "extra/hard"),
    ("rm", "-r", "extra"), ("top",), ("status",), ("events", "-n", "5"),
    ("snapshot", "create", "SNAPS", "models/clean"), ("snapshot", "ls", "SNAPS"),
    ("snapshot", "verify", "SNAPS"), ("snapshot", "restore", "SNAPS", "--as", "again"),
    ("info", "again/models/clean"), ("ls", "-l", "again/models"), ("status",), ("metrics",),
    ("snapshot", "rm", "SNAPS", "--keep", "0"),
    ("load", "WEIGHTS", "weights/tiny"), ("info", "weights/tiny"),
    ("meta", "ls", "weights/tiny"), ("save", "weights/tiny", "SAVED"),
]


def test_no_python_none_in_any_commands_human_output(ecc_daemon, command_tree, tmp_path):
    d = ecc_daemon
    make(d, "models/clean", durable=False)
    make(d, "models/fixable")
    make(d, "models/bad")
    (tmp_path / "in.bin").write_bytes(b"hello")
    from safetensors.numpy import save_file
    save_file({"w": np.arange(4, dtype=np.float32)}, str(tmp_path / "w.safetensors"))
    files = {"IN": str(tmp_path / "in.bin"), "OUT": str(tmp_path / "out.bin"),
             "SNAPS": str(tmp_path / "snaps"), "WEIGHTS": str(tmp_path / "w.safetensors"),
             "SAVED": str(tmp_path / "saved.safetensors")}
    ran: set[tuple[str, ...]] = set()
    for run in HUMAN_RUNS:
        argv = [files.get(word, word) for word in run]
        proc = d.cli(*argv)
        text = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        assert not re.search(r"\bNone\b", text), f"gpumemctl {' '.join(argv)}:\n{text}"
        assert "Traceback" not in text, text
        ran.add(max((w for w in leaf_commands(command_tree) if tuple(run[:len(w)]) == w),
                    key=len))
    assert (tmp_path / "out.bin").read_bytes()[:5] == b"hello"
    assert leaf_commands(command_tree) - ran == set(), "commands this test does not run"


# ---- what a verify finds is recorded, repaired or not ----------------------------------------
def verify(d, *args, code: int) -> dict:
    import json
    return json.loads(d.cli("verify", *args, "--json", check=code).stdout)


def ls_long_state(d, name: str) -> str:
    for line in d.cli("ls", "-l", check=True).stdout.decode().splitlines()[1:]:
        fields = line.split()
        if fields[-1] == name:
            return fields[6]
    raise AssertionError(f"{name} not in ls -l")


def test_damage_found_without_repair_is_recorded_until_repaired(ecc_daemon):
    d = ecc_daemon
    data = make(d, "a")
    d.cli("debug", "corrupt", "a", "--offset", "5000", "--length", "100", check=True)
    d.cli("debug", "corrupt", "a", "--offset", str(3 * BLOCK + 77), "--length", "4096",
          check=True)
    found = verify(d, "a", code=8)["allocations"][0]
    ranges = [[0, BLOCK], [3 * BLOCK, 4 * BLOCK]]
    assert (found["damaged"], found["damaged_ranges"]) == ([0, 3], ranges)
    info = d.cli_json("info", "a")
    assert (info["state"], info["damaged"]) == ("degraded", ranges)
    assert ls_long_state(d, "a") == "degraded"
    shown = d.cli("info", "a", check=True).stdout.decode()
    assert re.search(r"^damaged +0-131071, 393216-524287$", shown, re.MULTILINE), shown
    # Its bytes may be wrong until a repair decides: they are not served meanwhile.
    assert "damaged" in d.cli("read", "a", check=8).stderr.decode()
    damage = [e for e in d.cli_json("events") if e["kind"] == "damage"]
    assert damage[-1]["detail"]["reason"] == "verify without --repair"
    # It was all correctable: a repair brings the allocation and its bytes back.
    assert verify(d, "a", "--repair", code=1)["allocations"][0]["corrected"] == 2
    info = d.cli_json("info", "a")
    assert (info["state"], info["damaged"]) == ("ready", [])
    assert d.cli("read", "a", check=True).stdout == data
    verify(d, "a", code=0)


def test_uncorrectable_damage_found_without_repair_stays_after_a_repair_and_a_restart(
        ecc_daemon):
    d = ecc_daemon
    make(d, "a")
    d.cli("debug", "corrupt", "a", "--offset", str(2 * BLOCK), "--length", str(BLOCK),
          "--pattern", "5a", check=True)
    ranges = [[2 * BLOCK, 3 * BLOCK]]
    verify(d, "a", code=8)
    assert d.cli_json("info", "a")["damaged"] == ranges
    result = verify(d, "a", "--repair", code=8)["allocations"][0]
    assert (result["uncorrectable"], result["damaged_ranges"]) == (1, ranges)
    d.restart()
    info = d.cli_json("info", "a")
    assert (info["state"], info["damaged"]) == ("degraded", ranges)
    assert d.cli("read", "a", "--length", str(BLOCK), check=8).stdout == b""


def test_a_clean_verify_without_repair_changes_nothing(ecc_daemon):
    d = ecc_daemon
    make(d, "a")
    verify(d, "a", code=0)
    info = d.cli_json("info", "a")
    assert (info["state"], info["damaged"]) == ("ready", [])
    assert not [e for e in d.cli_json("events") if e["kind"] in ("damage", "healed")]


# ---- start-up: the fast path and typer agree, and the fast path loads no typer ----------------
@pytest.mark.parametrize("fast, through_typer", [
    (["ls", "-l", "-R"], ["ls", "-lR"]),                  # combined short flags: typer's
    (["info", "m/a"], ["info", "--", "m/a"]),             # `--`: typer's
    (["--json", "ls", "m"], ["--json", "ls", "--", "m"]),
    (["rm", "-r", "-f", "nothere", "m"], ["rm", "-rf", "nothere", "m"]),
], ids=lambda argv: " ".join(argv))
def test_the_fast_path_and_typer_print_the_same(daemon, fast, through_typer):
    from gpumemctl.cli.plain import parse
    assert parse(fast) is not None and parse(through_typer) is None
    results = []
    for argv in (fast, through_typer):
        daemon.cli("create", "m/a", "--size", "1M", "--exist-ok", check=True)
        proc = daemon.cli(*argv)
        results.append((proc.returncode, proc.stdout, proc.stderr))
    assert results[0] == results[1]


HEAVY = ("typer", "click", "rich", "textual", "cuda", "pynvml", "trio", "daemon", "numpy",
         "pydantic")


@pytest.mark.parametrize("argv", [["ls", "--json"], ["--json", "info", "x"],
                                  ["status", "--json"], ["ls", "-l"]], ids=" ".join)
def test_a_plain_command_loads_no_typer_click_or_rich(daemon, argv):
    daemon.cli("create", "x", "--size", "1M", check=True)
    code = ("import sys\n"
            "sys.argv = ['gpumemctl', '--socket', sys.argv[1], *sys.argv[2:]]\n"
            "from gpumemctl.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
            "sys.stderr.write(','.join(heavy)); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code, daemon.socket, *argv],
                          capture_output=True, text=True, cwd=ROOT, env=child_env(), check=False)
    assert proc.returncode == 0, f"loaded: {proc.stderr}"
    assert proc.stdout


def test_help_still_comes_from_typer(daemon):
    proc = daemon.cli("ls", "-h", check=0)
    assert b"List allocations and directories." in proc.stdout
    bare = subprocess.run(script_argv("gpumemctl"), capture_output=True, env=child_env(),
                          check=False)
    assert bare.returncode == 2 and b"Usage: gpumemctl" in bare.stdout
