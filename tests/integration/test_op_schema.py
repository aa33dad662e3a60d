"""The op table (daemon/server/ops.py): every op's argument schema, as a client sees it.

Against a real gpumemd: each argument of each op, given a value of the wrong type (or null
where null is not taken), and each required argument left out, is a usage error (code 2)
naming the argument, changes nothing, and leaves the connection usable; arguments left out
take the defaults of gpumemctl/protocol/defaults.py, the same ones the client library and
the CLI send. And docs/protocol.md documents exactly the ops and arguments of the table.
"""
from __future__ import annotations

import os
import re

import pytest

from daemon.server.ops import OPS
from daemon.server.schema import Kind
from gpumemctl.protocol import PROTOCOL_VERSION, UsageError
from gpumemctl.protocol.defaults import DIR_MODE, EVENTS_MAX_LIMIT, FILE_MODE

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "protocol.md")

# Arguments that make a good request of each op on the world `_world` makes ("a" exists).
GOOD_ARGS: dict[str, dict] = {
    "hello": {"version": PROTOCOL_VERSION}, "ls": {}, "info": {"path": "a"},
    "create": {"path": "new", "size": 4096}, "mkdir": {"path": "d"}, "rm": {"path": "a"},
    "durable": {"path": "a"}, "open": {"path": "a"}, "close": {"handle": 1},
    "rename": {"path": "a", "to": "a2"}, "resize": {"path": "a", "size": 8192},
    "read": {"path": "a", "length": 10}, "revoke": {"path": "a"},
    "attach": {"path": "a"}, "detach": {"handle": 1}, "seal": {"path": "a"},
    "sleep": {"path": "a"}, "wake": {"path": "a"}, "remap": {"handle": 1},
    "export_dmabuf": {"path": "a"}, "status": {}, "devices": {}, "events": {},
    "subscribe": {}, "verify": {}, "recover": {"path": "a"}, "check": {}, "scrub": {},
    "compact": {"dry_run": True},
    "debug_corrupt": {"path": "a", "offset": 0, "length": 1},
    "debug_gpu_event": {"device": 0, "xid": 13},
    "symlink": {"path": "link", "target": "a"}, "readlink": {"path": "link"},
    "link": {"path": "b", "target": "a"},
    "refill": {"path": "r", "size": 4096}, "changes": {"handle": 1},
    "refill_written": {"handle": 1, "ranges": [[0, 1]]},
    "snapshot_report": {"action": "verify", "result": "ok"},
    "meta_list": {"path": "a"}, "meta_get": {"path": "a", "key": "k"},
    "meta_set": {"path": "a", "key": "k", "value": "v"}, "meta_rm": {"path": "a", "key": "k"},
    "create_many": {"items": [{"path": "n", "size": 4096}]}, "remove_many": {"paths": ["a"]},
    "read_many": {"items": [{"path": "a"}]}, "write_many": {"items": [{"path": "a", "data": ""}]},
}
# A value of the wrong JSON type for each kind of argument.
WRONG = {Kind.STR: 7, Kind.INT: "7", Kind.BOOL: 1, Kind.OBJECT: [1],
         Kind.STR_LIST: ["a", 1], Kind.DEVICE: [0], Kind.LIST: {"path": "a"}}


def _world(c) -> dict:
    c.create("a", 4096)
    return c.info("a")


def _usage_error(c, op: str, args: dict) -> str:
    """The message of the usage error the daemon answers `op` with; fails otherwise."""
    try:
        c.call(op, **args)
    except UsageError as exc:
        return exc.message
    raise AssertionError(f"{op} {args!r} was accepted")


def _bad_cases():
    """(op, args, words the error must name) for every argument of every op."""
    for op in OPS.values():
        good = GOOD_ARGS[op.name]
        for arg in op.args:
            yield op.name, {**good, arg.name: WRONG[arg.kind]}, [repr(arg.name)]
            if arg.default is not None and not arg.nullable and not arg.required:
                yield op.name, {**good, arg.name: None}, [repr(arg.name), "None"]
            if arg.required:
                left_out = {k: v for k, v in good.items() if k != arg.name}
                yield op.name, left_out, ["missing", repr(arg.name)]


def test_every_op_has_good_arguments_here():
    """A new op in the table needs its good arguments above, so that its schema is tested."""
    assert set(GOOD_ARGS) == set(OPS)


def test_every_bad_argument_is_a_usage_error_that_changes_nothing(daemon):
    with daemon.client() as c:
        before = _world(c)
        wrong = []
        for op, args, words in _bad_cases():
            message = _usage_error(c, op, args)
            if not all(w in message for w in words):
                wrong.append(f"{op} {args!r}: {message!r} does not name {words}")
        assert wrong == []
        # nothing happened, and the same connection goes on working
        assert [e["path"] for e in c.ls()] == ["a"]
        after = c.info("a")
        assert after["durable"] == before["durable"] and after["holders"] == []
        assert c.info("a")["modified"] == before["modified"]


def test_wrong_type_messages_name_the_value_and_what_is_allowed(daemon):
    with daemon.client() as c:
        message = _usage_error(c, "create", {"path": "x", "size": True})
        assert "'size'" in message and "True" in message and "integer" in message
        message = _usage_error(c, "verify", {"paths": ["a", 1]})
        assert "'paths'" in message and "list of strings" in message
        message = _usage_error(c, "scrub", {"action": "later"})
        assert "'later'" in message and "start, stop, status" in message
        assert c.ls() == []


def test_left_out_arguments_take_the_shared_defaults(daemon):
    """A bare request gets the defaults of gpumemctl/protocol/defaults.py; the client
    library and the CLI, sending theirs, get the same."""
    with daemon.client() as c:
        assert c.call("create", path="bare", size=4096)["mode"] == f"{FILE_MODE:04o}"
        assert c.call("mkdir", path="dir")["mode"] == f"{DIR_MODE:04o}"
        assert c.create("lib", 4096)["mode"] == f"{FILE_MODE:04o}"
        assert c.mkdir("libdir")["mode"] == f"{DIR_MODE:04o}"
        # no mode: a read handle
        result, fds = c.call_fds("open", path="bare")
        for fd in fds:
            os.close(fd)
        assert [h["kind"] for h in c.info("bare")["holders"]] == ["read"]
        c.call("close", handle=result["handle"])
        # null where the default is null: the daemon's own ecc, the first device
        made = c.call("create", path="nulls", size=4096, ecc=None, device=None)
        assert made["ecc"] == "rs" and made["device"] == c.devices()[0]["uuid"]
    assert daemon.cli_json("create", "cli", "--size", "4096")["mode"] == f"{FILE_MODE:04o}"
    assert daemon.cli_json("mkdir", "clidir")["mode"] == f"{DIR_MODE:04o}"


def test_limit_is_brought_into_its_bounds_not_refused(daemon):
    with daemon.client() as c:
        for i in range(3):
            c.mkdir(f"d{i}")
        everything = c.call("events", limit=EVENTS_MAX_LIMIT)["events"]
        assert len(everything) >= 4                     # start and the three mkdirs
        assert c.call("events", limit=0)["events"] == everything[-1:]
        assert c.call("events", limit=-5)["events"] == everything[-1:]
        assert c.call("events", limit=10**12)["events"] == everything


def test_arguments_an_op_does_not_take_are_ignored(daemon):
    with daemon.client() as c:
        c.create("a", 4096)
        assert [e["path"] for e in c.call("ls", bogus=1, path="")["entries"]] == ["a"]


def test_a_second_hello_is_a_usage_error(daemon):
    with daemon.client() as c:
        assert "first request" in _usage_error(c, "hello", {"version": PROTOCOL_VERSION})
        assert c.ls() == []


# ---- docs/protocol.md documents the table ---------------------------------------------------

def _documented() -> dict[str, set[str]]:
    """op -> the argument names its row of the docs table gives: the backquoted words of
    its args column once the parenthesised notes (values, defaults) are taken out."""
    with open(DOCS) as f:
        text = f.read()
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \| .* \| .* \|$", text, re.MULTILINE)
    assert rows, "no op table found in docs/protocol.md"
    documented = {}
    for op, args in rows:
        while re.search(r"\([^()]*\)", args):
            args = re.sub(r"\([^()]*\)", "", args)
        documented[op] = set(re.findall(r"`(\w+)`", args))
    return documented


def test_docs_document_every_op_and_no_other():
    assert set(_documented()) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_docs_name_exactly_the_arguments_of_each_op(op):
    assert _documented()[op] == {a.name for a in OPS[op].args}
