"""Help as a new user reads it (issue 27, item 9): the command lists of `gpumemctl -h`,
`snapshot -h`, `meta -h` and `debug -h` show each command's summary without the
docstrings' line breaks; every command's `-h` ends with examples; `verify -h` says why a
plain verify leaves damage unrepaired."""
from __future__ import annotations

import subprocess

import pytest

from gpumemctl.cli.examples import EXAMPLES
from tests.harness import child_env, script_argv

GROUPS = ("snapshot", "meta", "debug", "scrub")


def _help(*args: str, columns: int = 80) -> str:
    env = child_env({"COLUMNS": str(columns), "TERM": "dumb"})
    proc = subprocess.run(script_argv("gpumemctl") + [*args, "-h"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _commands() -> list[str]:
    from gpumemctl.cli.typerapp import ORDER
    return [c for c in ORDER if c not in GROUPS] + [c for c in EXAMPLES if " " in c]


def test_the_command_list_has_no_docstring_line_breaks():
    wide = _help(columns=400)
    load = next(ln for ln in wide.splitlines() if ln.strip(" │").startswith("load "))
    assert "the header kept as NAME's metadata" in load, load
    for group in ("snapshot", "meta", "debug"):
        lines = [ln.strip(" │") for ln in _help(group, columns=400).splitlines()]
        entries = [ln for ln in lines if ln and not ln.startswith(("╭", "╰", "-", "Usage"))]
        # In a wide terminal each command is one line: no continuation lines between them.
        cont = [ln for ln in entries if ln.startswith(" ")]
        assert not cont, (group, cont)


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_examples(command):
    text = _help(*command.split(), columns=100)
    assert "Examples:" in text, text[-500:]
    after = text.split("Examples:", 1)[1]
    assert all(example.split("#")[0].strip() in " ".join(after.split())
               for example in EXAMPLES[command]), after


def test_verify_help_says_why_a_plain_verify_does_not_repair():
    text = " ".join(_help("verify", columns=100).split())
    assert "Without --repair a verify only looks" in text
    assert "recover NAME" in text and "scrub" in text


def test_every_declared_command_has_examples_in_the_table():
    from gpumemctl.cli.declare import Group
    from gpumemctl.cli.typerapp import declared
    names = []
    for name, member in declared().items():
        if isinstance(member, Group):
            names += [f"{name} {sub}" for sub in member.members]
            if member.default is not None:
                names.append(name)
        else:
            names.append(name)
    assert sorted(set(names) - set(EXAMPLES)) == [], "commands without examples"
