"""Event details (daemon/core/events.py): the schema names everything the daemon emits, and what
is stored is bounded whatever a client sends."""
from __future__ import annotations

import ast
import json
import pathlib

import pytest

from daemon.core.events import DETAIL_LIMIT, LIST_LIMIT, SCHEMA, STRING_LIMIT, bound_detail

DAEMON = pathlib.Path(__file__).resolve().parents[2] / "daemon"
EMITTERS = ("event", "_event", "note")   # Journal.event/note, Scrubber._event


def _kinds(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _kinds(node.body) + _kinds(node.orelse)
    return []


def _keys(call: ast.Call) -> list[str]:
    keys = [k.arg for k in call.keywords if k.arg is not None]
    for k in call.keywords:             # **{"from": ..., "to": ...}
        if k.arg is None and isinstance(k.value, ast.Dict):
            keys += [key.value for key in k.value.keys if isinstance(key, ast.Constant)]
    return keys


def emitted() -> set[tuple[str, str, str]]:
    """(file, kind, key) for every literal event kind and keyword in the daemon's code."""
    found = set()
    for source in DAEMON.rglob("*.py"):
        for call in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in EMITTERS and call.args):
                continue
            for kind in _kinds(call.args[0]):
                found.add((source.name, kind, ""))
                found |= {(source.name, kind, key) for key in _keys(call)}
    return found


def test_the_schema_names_every_kind_and_key_the_daemon_emits():
    found = emitted()
    assert {kind for _, kind, _ in found} >= {"create", "remove", "write", "scrub", "adopt"}
    missing = sorted((f, kind, key) for f, kind, key in found
                     if kind not in SCHEMA or (key and key not in SCHEMA[kind]))
    assert missing == [], "add these to daemon/core/events.py SCHEMA (else they are dropped)"


def test_unknown_keys_and_wrong_types_are_dropped_and_counted():
    assert bound_detail("write", {"offset": 4, "bytes": 8, "junk": "x" * 10**6}) == \
        {"offset": 4, "bytes": 8, "dropped_keys": 1}
    assert bound_detail("create", {"size": "big", "durable": 1, "lease": False}) == \
        {"lease": False, "dropped_keys": 2}
    assert bound_detail("write", {"offset": 1 << 80}) == {"dropped_keys": 1}


def test_long_strings_are_cut_with_a_marker_and_lists_summarised():
    cut = bound_detail("lost", {"reason": "r" * 5000})["reason"]
    assert len(cut) <= STRING_LIMIT and cut.endswith(f"[{5000 - STRING_LIMIT + 32} more "
                                                     "characters]")
    blocks = list(range(3, 3 + LIST_LIMIT + 1))
    assert bound_detail("healed", {"blocks": blocks}) == \
        {"blocks": {"count": LIST_LIMIT + 1, "first": 3, "last": 3 + LIST_LIMIT}}
    assert bound_detail("healed", {"blocks": blocks[:LIST_LIMIT]}) == \
        {"blocks": blocks[:LIST_LIMIT]}


@pytest.mark.parametrize("kind, detail", [
    ("rename", {"from": "a" * 3000, "to": "b" * 3000}),
    ("brand-new-kind", {f"k{i}": "v" * 500 for i in range(40)}),
    ("brand-new-kind", {f"k{i}": i for i in range(2000)}),
])
def test_every_detail_fits_the_limit(kind, detail):
    bounded = bound_detail(kind, detail)
    assert len(json.dumps(bounded, sort_keys=True)) <= DETAIL_LIMIT
    assert bounded                       # cut down, not emptied


def test_a_detail_a_client_reports_carries_no_text():
    """`close`'s `written` is the client's: numbers only, so a client's newline or ESC
    never becomes event text of its own (names are the daemon's, escaped when shown)."""
    from daemon.core.events import CLIENT_REPORTED
    assert CLIENT_REPORTED and all("str" not in SCHEMA[kind].values() for kind in CLIENT_REPORTED)
    forged = "\n     9 2026-01-01T00:00:00Z remove    /etc uid=0 \x1b]0;pwned\x07"
    assert bound_detail("write", {"offset": 0, "bytes": 5, "note": forged,
                                  "ranges": forged, "reason": forged}) == \
        {"offset": 0, "bytes": 5, "dropped_keys": 3}
