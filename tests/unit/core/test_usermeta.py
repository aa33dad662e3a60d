"""User metadata's rules and bounds (daemon/core/usermeta.py) on their own: how a key and a
value are spelt, what they weigh, and the two bounds a change that grows metadata meets."""
from __future__ import annotations

import pytest

from daemon.core import usermeta
from daemon.core.usermeta import (
    MAX_KEY_BYTES,
    Bounds,
    MetadataQuotaExceeded,
    entries,
    key_bytes,
    shown,
    size_of,
    value_bytes,
)
from gpumemctl.protocol import NoMemory, UsageError


@pytest.mark.parametrize("key, raw", [
    ("k", b"k"),
    ("é", "é".encode()),
    ("\udcff\udcfe", b"\xff\xfe"),             # bytes that are not UTF-8 (surrogateescape)
    ("k" * MAX_KEY_BYTES, b"k" * MAX_KEY_BYTES),
    ("gpu", b"gpu"),                           # not reserved: only "gpu." is
])
def test_a_valid_key_is_its_bytes(key, raw):
    assert key_bytes(key) == raw


@pytest.mark.parametrize("key, words", [
    ("", "1 to 250 bytes"),
    ("k" * 251, "251 bytes, at most 250"),
    ("é" * 126, "252 bytes"),                  # counted in bytes, not characters
    ("a\0b", "NUL"),
    ("gpu.size", "reserved"),
    ("\ud800", "surrogate"),
    (7, "must be a string"),
])
def test_a_bad_key_is_a_usage_error_naming_the_rule(key, words):
    with pytest.raises(UsageError, match=words):
        key_bytes(key)


def test_values_are_any_bytes():
    assert value_bytes("") == b""
    assert value_bytes("a\0b") == b"a\0b"
    assert value_bytes("\udc80") == b"\x80"
    assert value_bytes(b"\xff") == b"\xff"
    with pytest.raises(UsageError, match="must be a string"):
        value_bytes(3, "k")
    with pytest.raises(UsageError, match="surrogate"):
        value_bytes("\ud800", "k")


def test_entries_checks_each_key_once_by_its_bytes():
    assert entries({"a": "1", "b": ""}) == {b"a": b"1", b"b": b""}
    with pytest.raises(UsageError, match="given twice"):
        entries({"\udcc3\udca9": "x", "é": "y"})      # one key, two spellings
    with pytest.raises(UsageError, match="must be an object"):
        entries(["a"])


def test_size_and_shown_form():
    metadata = {b"b": b"22", b"a": b"\xff"}
    assert size_of(metadata) == 1 + 2 + 1 + 1
    assert list(shown(metadata).items()) == [("a", "\udcff"), ("b", "22")]


def bounds(used: dict[int, int], node_max: int = 100, user_max: int = 150) -> Bounds:
    return Bounds(node_max, user_max, used=lambda uid: used.get(uid, 0),
                  exempt=lambda uid: uid == 0)


def test_one_nodes_metadata_is_bounded_for_everyone():
    b = bounds({})
    b.check("a", 1000, 0, 100)                 # at the bound
    for uid in (1000, 0):                       # root too: a bound of the format
        with pytest.raises(UsageError) as exc:
            b.check("a", uid, 0, 101)
        assert exc.value.details == {"errno": "ENOSPC", "bytes": 101, "limit": 100}


def test_a_users_metadata_is_bounded_but_roots_is_not():
    b = bounds({1000: 100, 0: 10_000})
    b.check("a", 1000, 0, 50)                   # 100 + 50: at the bound
    with pytest.raises(MetadataQuotaExceeded) as exc:
        b.check("a", 1000, 10, 61)              # 51 more
    assert isinstance(exc.value, NoMemory)
    assert exc.value.details == {"errno": "EDQUOT", "uid": 1000, "quota": 150, "used": 100,
                                 "requested": 51}
    b.check("a", 0, 0, 100)                     # root: over its total, not bound


def test_a_change_that_keeps_or_shrinks_metadata_always_passes():
    b = bounds({1000: 10_000}, node_max=10)     # over both bounds already
    b.check("a", 1000, 500, 500)
    b.check("a", 1000, 500, 20)


def test_the_defaults_fit_a_request():
    assert usermeta.DEFAULT_MAX_BYTES <= usermeta.MAX_BYTES_LIMIT < 1 << 20
