"""The wire contract: sizes, names, framing, and the error table behind the exit codes."""
from __future__ import annotations

import os
import socket

import pytest

from gpumemctl.protocol import (
    ERROR_TABLE,
    GpumemError,
    ProtocolError,
    UsageError,
    error_from_wire,
    errors,
    format_size,
    framing,
    normalize,
    parse_size,
)


@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), ("64K", 65536), ("64KiB", 65536), ("1.5G", 1610612736),
    ("2GB", 2_000_000_000), ("1M", 1 << 20), ("3MiB", 3 << 20), ("1kB", 1000),
    ("1T", 1 << 40), ("10B", 10), (" 7 ", 7), ("2.5K", 2560),
])
def test_sizes_accepted(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "-1", "0", "1e99", "12XB", "", "1.3K", "5 G G",
                                  "0x10", "99999999999T", "1,5G", "inf", "nan"])
def test_sizes_rejected_name_the_value(text):
    with pytest.raises(UsageError) as exc:
        parse_size(text)
    assert repr(text) in str(exc.value) or text.strip() in str(exc.value)
    assert exc.value.code == 2


def test_format_size_round_trips_common_values():
    assert format_size(1 << 30) == "1G"
    assert format_size(1536 << 20) == "1.5G"
    assert format_size(512) == "512B"
    assert parse_size(format_size(16 << 20)) == 16 << 20


@pytest.mark.parametrize("name", ["..", ".", "", "a/../b", "a//b", "a/", "x\0y", "a/./b",
                                  "a" * 256, ("abcd/" * 1000)])
def test_bad_names(name):
    with pytest.raises(UsageError):
        normalize(name)


def test_good_names():
    assert normalize("/models/llama") == "models/llama"
    assert normalize("a" * 255) == "a" * 255
    assert normalize("x/" * 100 + "y") == "x/" * 100 + "y"
    # Any byte but NUL and '/' is allowed: names travel as surrogate-escaped str.
    weird = os.fsdecode(b"caf\xe9 \x01")
    assert normalize(weird) == weird


def test_error_codes_are_the_exit_codes():
    assert {c: n for c, (n, _) in ERROR_TABLE.items()} == {
        0: "ok", 1: "repaired", 2: "usage", 3: "not_running", 4: "not_found", 5: "exists",
        6: "permission", 7: "no_memory", 8: "uncorrectable", 9: "busy",
        10: "invalid_state", 70: "internal"}
    for cls in GpumemError.__subclasses__():
        rebuilt = error_from_wire(cls("boom").to_wire())
        assert type(rebuilt) is cls and rebuilt.code == cls.code and str(rebuilt) == "boom"
    assert isinstance(error_from_wire({"code": 4, "message": "x"}), errors.NotFound)


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return a, b


def test_frame_round_trip_with_fds():
    a, b = _pair()
    r, w = os.pipe()
    try:
        framing.send_frame(a, {"op": "x", "name": os.fsdecode(b"\xff")}, [r, w])
        msg, fds = framing.recv_frame(b, 1 << 20)
        assert msg == {"op": "x", "name": os.fsdecode(b"\xff")}
        assert len(fds) == 2
        os.write(fds[1], b"hi")
        assert os.read(r, 2) == b"hi"   # the passed fd is the same pipe
        framing.close_fds(fds)
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_frames_back_to_back_keep_their_fds():
    a, b = _pair()
    fds_sent = [os.open("/dev/null", os.O_RDONLY) for _ in range(3)]
    framing.send_frame(a, {"n": 1}, fds_sent[:1])
    framing.send_frame(a, {"n": 2})
    framing.send_frame(a, {"n": 3}, fds_sent[1:])
    got = [framing.recv_frame(b, 1 << 20) for _ in range(3)]
    assert [(m["n"], len(f)) for m, f in got] == [(1, 1), (2, 0), (3, 2)]
    for _, f in got:
        framing.close_fds(f)
    framing.close_fds(fds_sent)
    a.close()
    b.close()


def test_oversized_and_bad_frames_are_rejected():
    with pytest.raises(ProtocolError, match="exceeds"):
        framing.parse_header(framing.HEADER.pack(b"GMP1", 2 << 20, 0, 0), 1 << 20)
    with pytest.raises(ProtocolError, match="magic"):
        framing.parse_header(b"GET / HTTP/1.1", 1 << 20)
    with pytest.raises(ProtocolError, match="fds"):
        framing.parse_header(framing.HEADER.pack(b"GMP1", 2, 17, 0), 1 << 20)
    with pytest.raises(ProtocolError, match="JSON"):
        framing.decode_payload(b"\x00garbage")
    with pytest.raises(ProtocolError, match="object"):
        framing.decode_payload(b"[1,2]")


def test_truncated_frame_is_eof_not_a_hang():
    a, b = _pair()
    a.sendall(framing.HEADER.pack(b"GMP1", 100, 0, 0) + b"{}")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        framing.recv_frame(b, 1 << 20)
    a.close()
    b.close()
