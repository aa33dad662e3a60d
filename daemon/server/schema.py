"""Argument schemas: what each request's `args` may hold, checked before any handler runs.

An op declares its arguments once (daemon/server/ops.py) as `Arg`s: a name, a type, a default
(or none: required), whether JSON null is taken (and means the default), and a bound (a
range an integer is brought into, or the words a string may be). `validate()`
turns the args of a request into a dict with every declared argument present, or raises
UsageError naming the bad argument, the value and what is allowed: the protocol's code 2,
after which the connection stays usable. Arguments the op does not declare are ignored, so a
newer client's extra argument does not break an older daemon (docs/protocol.md).
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from gpumemctl.protocol import UsageError


class Kind(enum.Enum):
    """A JSON type an argument may have, and how an error message names it."""
    STR = "a string"
    INT = "an integer"
    BOOL = "true or false"
    OBJECT = "an object"
    STR_LIST = "a list of strings"
    LIST = "a list"                 # of anything: the handler checks each element
    DEVICE = "a device index or UUID string"     # taken as the string it spells


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()     # the default of an argument a request must give


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    kind: Kind
    default: Any = REQUIRED
    nullable: bool = False          # null is taken, and stands for the default
    clamp: tuple[int, int] | None = None    # INT: brought into [low, high], never refused
    choices: tuple[str, ...] = ()   # STR: the words allowed
    what: str | None = None         # what an error calls a good value, if not kind's words

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def describe(self) -> str:
        return self.what or self.kind.value

    def take(self, args: Mapping[str, Any]) -> Any:
        """This argument's value in `args`, checked, with its default where it is absent."""
        if self.name not in args:
            if self.required:
                raise UsageError(f"missing argument {self.name!r}: {self.describe()}")
            return self._default()
        value = args[self.name]
        if value is None and (self.nullable or self.default is None):
            return self._default()
        return self._check(value)

    def _default(self) -> Any:
        # a fresh list each time: a handler may keep or change what it was given
        return list(self.default) if isinstance(self.default, list) else self.default

    def _check(self, value: Any) -> Any:
        if not _is(self.kind, value):
            raise UsageError(f"argument {self.name!r} must be {self.describe()}, "
                             f"not {value!r}")
        if self.kind is Kind.DEVICE:
            return str(value)
        if self.choices and value not in self.choices:
            raise UsageError(f"argument {self.name!r} must be one of "
                             f"{', '.join(self.choices)}, not {value!r}")
        if self.clamp is not None:
            low, high = self.clamp
            return min(max(value, low), high)
        return value


def _is(kind: Kind, value: Any) -> bool:
    """Whether `value` is of `kind` (JSON's true and false are not integers here)."""
    if kind is Kind.BOOL:
        return isinstance(value, bool)
    if kind is Kind.INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is Kind.STR:
        return isinstance(value, str)
    if kind is Kind.OBJECT:
        return isinstance(value, dict)
    if kind is Kind.STR_LIST:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind is Kind.LIST:
        return isinstance(value, list)
    return isinstance(value, str) or _is(Kind.INT, value)      # Kind.DEVICE


def validate(schema: tuple[Arg, ...], args: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument of `schema`, checked and defaulted; others in `args` are dropped."""
    return {arg.name: arg.take(args) for arg in schema}
