"""Names as long as a request may carry, of bytes that are not UTF-8 (JSON spells each one
six characters, `\\udcff`): the cheapest way to make a user's tree, or the answers about
it, as large as possible (issue 24: tests/security/test_deep_tree_snapshot.py,
test_verify_answer_size.py)."""
from __future__ import annotations

from gpumemctl.protocol import name_from_bytes

COMPONENT = name_from_bytes(b"\xff" * 255)          # 255 bytes, 1,530 characters of JSON
CHAIN = "/".join([COMPONENT] * 15)                   # 3,839 bytes


def leaf(i: int) -> str:
    """The i-th leaf's name: 240 bytes that are never UTF-8 (0xf8-0xff), unique per i < 4096."""
    digits = bytes(0xF8 + (i >> shift & 7) for shift in (9, 6, 3, 0))
    return name_from_bytes(digits + b"\xff" * 236)
