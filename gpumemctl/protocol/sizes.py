"""Size parsing and formatting (docs/design.md, "Sizes").

Accepted: a whole number of bytes (`4096`), or a number (fractions allowed) with a unit.
K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; kB/KB/MB/GB/TB powers of 1000; B is bytes.
The result must be a whole number of bytes between 1 and 2**62. Anything else is a usage error
that names the value and says what is allowed.
"""
from __future__ import annotations

from .errors import UsageError

MAX_SIZE = 1 << 62

UNITS = {
    "": 1, "B": 1,
    "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$"
ALLOWED = "a whole number of bytes or a number with a unit: 4096, 64K, 64KiB, 1.5G, 2GB " \
          "(K/M/G/T and KiB..TiB = 1024-based; kB/MB/GB/TB = 1000-based)"


def parse_size(text: str | int, *, allow_zero: bool = False) -> int:
    """Parse a user-given size into bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        # Imported on first use: `gpumemctl ls` needs neither (protocol/jsontext.py: why).
        import re
        from decimal import Decimal, InvalidOperation
        match = re.match(SIZE_PATTERN, str(text))
        if not match or match.group(2) not in UNITS:
            raise UsageError(f"invalid size {str(text)!r}: expected {ALLOWED}")
        try:
            exact = Decimal(match.group(1)) * UNITS[match.group(2)]
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            raise UsageError(f"invalid size {str(text)!r}: expected {ALLOWED}") from None
        if exact != exact.to_integral_value():
            raise UsageError(f"invalid size {str(text)!r}: {exact} is not a whole number "
                             f"of bytes")
        value = int(exact)
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"invalid size {str(text)!r}: must be at least 1 byte")
    if value > MAX_SIZE:
        raise UsageError(f"invalid size {str(text)!r}: larger than the maximum of "
                         f"{MAX_SIZE} bytes (4 EiB)")
    return value


def format_size(n: int | None) -> str:
    """Human form with 1024-based units, e.g. 1.5G; exact bytes below 1 KiB."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n}B"
    value = float(n)
    for unit in ("K", "M", "G", "T", "P", "E"):
        value /= 1024
        if value < 1024 or unit == "E":
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    raise AssertionError("unreachable")


def round_up(n: int, granularity: int) -> int:
    return -(-n // granularity) * granularity


def out_of_range(path: str, offset: int, length: int, size: int, *, writing: bool,
                 done: str = "") -> UsageError:
    """The error for bytes [offset, offset+length) that are not all within `path`'s
    `size`, worded one way for every path that checks (handles, attachments, copies, the
    daemon's): what was asked, the size, and for a write the command that makes room.
    `done`: what happened meanwhile ("nothing was written")."""
    what = "write" if writing else "read"
    if offset < 0 or length < 0:
        asked = f"offset {offset}" if offset < 0 else f"length {length}"
        message = f"cannot {what} '{path}' at {asked}: offsets and lengths are 0 or more"
    elif offset > size:
        message = (f"cannot {what} '{path}' at offset {offset}: that is outside its size "
                   f"{size} ({format_size(size)})")
    else:
        message = (f"cannot {what} {length} bytes at offset {offset} of '{path}': that is "
                   f"outside its size {size} ({format_size(size)})")
    if done:
        message += f"; {done}"
    if writing and offset >= 0 and length >= 0:
        message += (f"; make room first: gpumemctl resize {path} --size {offset + length} "
                    "(or gpumemctl write --grow)")
    return UsageError(message, details={"size": size, "offset": offset, "length": length})
