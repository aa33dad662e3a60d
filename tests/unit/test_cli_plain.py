"""The CLI's fast path (gpumemctl/cli/plain.py) against typer and click, which it stands in
for: the same options, arguments and defaults, the same parse of real command lines, and
every command line it is not sure of left to typer. Also its JSON codec against `json`."""
from __future__ import annotations

import inspect
import json
import math

import click
import pytest

from gpumemctl.cli import context as actions
from gpumemctl.cli import plain as fastargs
from gpumemctl.cli.typerapp import build_command
from gpumemctl.protocol import jsontext

GROUP = build_command()
# Options click acts on at once, then exits: the fast path leaves every command line with
# one of them to typer (an option it does not know), so it need not know them.
HELP = {"-h", "--help", "--version"}


def click_options(cmd: click.Command) -> dict:
    """option spelling -> (parameter, takes a value), as click reads `cmd`."""
    return {spelling: (p.name, not p.is_flag)
            for p in cmd.params if isinstance(p, click.Option)
            for spelling in p.opts + p.secondary_opts if spelling not in HELP}


def fast_options(spec: fastargs.Spec) -> dict:
    return {**{s: (name, False) for s, name in spec.flags.items()},
            **{s: (name, True) for s, name in spec.values.items()}}


def test_the_global_options_are_clicks():
    # The group's --json is `json_` in typer, `json` in Call: compare the spellings.
    assert set(fast_options(fastargs.GLOBAL)) == set(click_options(GROUP))
    assert {s: t for s, (_, t) in fast_options(fastargs.GLOBAL).items()} == \
        {s: t for s, (_, t) in click_options(GROUP).items()}


@pytest.mark.parametrize("name", sorted(fastargs.COMMANDS))
def test_each_fast_command_reads_as_click_declares_it(name):
    cmd, spec = GROUP.commands[name], fastargs.COMMANDS[name]
    assert fast_options(spec) == click_options(cmd)
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    assert tuple(p.name for p in arguments) == spec.positional
    assert sum(p.required for p in arguments) == spec.required
    assert spec.variadic == bool(arguments and arguments[-1].nargs == -1)
    assert set(spec.needed) == {p.name for p in cmd.params
                                if isinstance(p, click.Option) and p.required}


@pytest.mark.parametrize("name", sorted(fastargs.COMMANDS))
def test_both_paths_run_one_body_with_the_declared_defaults(name):
    cmd, body = GROUP.commands[name], fastargs.find(name).body
    assert cmd.callback.body is body
    signature = inspect.signature(body).parameters
    assert list(signature) == [p.name for p in cmd.params]
    for p in cmd.params:
        if not p.required:
            assert signature[p.name].default == p.default, p.name


PLAIN = [
    ["ls"], ["ls", "--json"], ["--json", "ls", "models"], ["ls", "-l", "-R", "d"],
    ["ls", "d", "--long", "--recursive", "--json"], ["ls", ""], ["ls", "-"],
    ["--socket", "/run/x.sock", "ls"], ["--socket=/run/x.sock", "--json", "ls", "-l"],
    ["--socket", "", "status"], ["info", "a/b"], ["info", "--json", "modèles/α"],
    ["status"], ["status", "--json", "--json"],
    ["create", "x", "--size", "1M"], ["create", "-s", "2G", "x", "--size", "4K"],
    ["create", "--size=1M", "x", "--durable", "--mode", "0640", "--ecc", "none",
     "--device", "0", "--exist-ok", "--json"],
    ["create", "x"], ["create", "--from", "list.txt", "--durable", "--mode", "0640"],
    ["create", "--from=-", "--json"],
    ["mkdir", "d"], ["mkdir", "-p", "a/b", "--mode=0700", "--json"],
    ["rm", "a"], ["rm", "a", "b", "-r", "-f", "c", "--json"], ["rm", "-R", "--force", "x"],
    ["durable", "a", "b"], ["transient", "--json", "a"],
    ["write", "a"], ["write", "a", "-", "--offset", "4K"], ["write", "a", "in.bin", "--json"],
    ["read", "a"], ["read", "a", "out.bin", "--offset=1M", "--length", "4"],
]


def clicks_reading(argv: list[str], monkeypatch) -> tuple:
    """What typer and click make of `argv`: the body they run, its parameters, and the
    global options (the bodies are not run: this compares parsers)."""
    seen = []
    monkeypatch.setattr(actions, "invoke", lambda body, params: seen.append((body, params)))
    monkeypatch.setattr(actions.Settings, "socket", None)
    monkeypatch.setattr(actions.Settings, "json", False)
    GROUP.main(args=list(argv), prog_name="gpumemctl", standalone_mode=False)
    [(body, params)] = seen
    return body.__name__, params, actions.Settings.socket, actions.Settings.json


@pytest.mark.parametrize("socket_env", [None, "", "/env/gpumemd.sock"])
@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_plain_command_lines_read_as_click_reads_them(argv, socket_env, monkeypatch):
    if socket_env is None:
        monkeypatch.delenv("GPUMEMD_SOCKET", raising=False)
    else:
        monkeypatch.setenv("GPUMEMD_SOCKET", socket_env)
    call = fastargs.parse(argv)
    assert call is not None, "the fast path should take this command line"
    body = fastargs.find(call.command).body
    defaults = {n: p.default for n, p in inspect.signature(body).parameters.items()
                if p.default is not inspect.Parameter.empty}
    assert (call.command, {**defaults, **call.params}, call.socket, call.json) == \
        clicks_reading(argv, monkeypatch)


LEFT_TO_TYPER = [
    [], ["-h"], ["--help"], ["ls", "-h"], ["create", "--help"], ["ls", "-lR"],
    ["ls", "--", "-x"], ["ls", "a", "b"], ["info"], ["rm"],
    ["create", "x", "--size"], ["create", "x", "-s1M"], ["create", "x", "--size", "-1"],
    ["ls", "--bogus"], ["lss"], ["--json=1", "ls"], ["ls", "--json=yes"], ["--socket"],
    ["ls", "--socket", "/x"], ["read", "a", "b", "c"], ["verify", "--all"],
    ["scrub", "status"], ["events", "-n", "3"], ["top"], ["doctor"], ["ls", "-1"],
]


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=lambda a: " ".join(a) or "(none)")
def test_everything_else_is_left_to_typer(argv):
    assert fastargs.parse(argv) is None


# ---- the JSON codec of the wire and of --json ---------------------------------------------
DOCUMENTS = [
    {}, [], "", 0, -1, 10**30, 1.5, -0.0, 1e300, True, False, None,
    {"path": "modèles/α", "bytes": "\udcff\x00\x1f\"\\/", "nested": [[{"a": [None]}]]},
    ["\u2028", "\U0001f600", {"k": 3.141592653589793}],
]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=repr)
def test_jsontext_writes_what_json_writes_and_reads_it_back(doc):
    text = jsontext.dumps(doc)
    assert text == json.dumps(doc, separators=(",", ":"))
    assert jsontext.loads(text) == json.loads(text)
    assert jsontext.loads(" \n" + json.dumps(doc, indent=2) + "\t\r\n") == doc


def test_jsontext_nan_and_infinity_as_json_has_them():
    text = jsontext.dumps([float("nan"), float("inf"), float("-inf")])
    assert text == "[NaN,Infinity,-Infinity]"
    nan, inf, ninf = jsontext.loads(text)
    assert math.isnan(nan) and inf == math.inf and ninf == -math.inf


@pytest.mark.parametrize("text", ["", " ", "{", "[1,]", "nul", '"\\x"', '{"a":1}x', "1 2",
                                  '{"a" 1}', "\x00", "[" * 100_000])
def test_jsontext_refuses_what_json_refuses(text):
    with pytest.raises((ValueError, RecursionError)):
        json.loads(text)
    with pytest.raises((ValueError, RecursionError)):
        jsontext.loads(text)


def test_jsontext_refuses_what_json_cannot_write():
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"a": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsontext.dumps(loop)
    # A failed document leaves nothing behind for the next one.
    assert jsontext.dumps([loop[:0], {"a": 1}]) == '[[],{"a":1}]'
