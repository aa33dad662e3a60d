"""The numbered error table shared by the daemon, the wire and the CLI.

Every error the daemon can answer has a code, and the code *is* the CLI's exit status
(docs/design.md, "Exit codes"). The man page's EXIT STATUS table and the tests are generated from
`ERROR_TABLE`, so adding a code here is the only step needed to publish it.
"""
from __future__ import annotations

OK = 0
REPAIRED = 1
USAGE = 2
NOT_RUNNING = 3
NOT_FOUND = 4
EXISTS = 5
PERMISSION = 6
NO_MEMORY = 7
UNCORRECTABLE = 8
BUSY = 9
INVALID_STATE = 10
INTERNAL = 70

# code -> (wire name, one-line meaning for docs and man pages)
ERROR_TABLE: dict[int, tuple[str, str]] = {
    OK: ("ok", "success"),
    REPAIRED: ("repaired", "verify/scrub found damage and repaired all of it"),
    USAGE: ("usage", "usage error: bad arguments, bad name or size, malformed request"),
    NOT_RUNNING: ("not_running", "daemon not running or socket unreachable"),
    NOT_FOUND: ("not_found", "no such allocation or directory"),
    EXISTS: ("exists", "an allocation or directory of that name exists"),
    PERMISSION: ("permission", "permission denied"),
    NO_MEMORY: ("no_memory", "out of GPU (or host backend) memory, or over a quota"),
    UNCORRECTABLE: ("uncorrectable", "uncorrectable damage found"),
    BUSY: ("busy", "busy or locked: held by another client"),
    INVALID_STATE: ("invalid_state", "invalid state for this operation (e.g. lost)"),
    INTERNAL: ("internal", "internal error (a bug: please report it)"),
}


class GpumemError(Exception):
    """An error with a protocol code. `str()` is the one line shown to a user."""

    code = INTERNAL

    def __init__(self, message: str, *, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}

    @property
    def name(self) -> str:
        return ERROR_TABLE[self.code][0]

    def to_wire(self) -> dict:
        return {"code": self.code, "name": self.name, "message": self.message,
                "details": self.details}


class UsageError(GpumemError):
    code = USAGE


class ProtocolError(UsageError):
    """A malformed frame or request. The daemon answers it and, for framing errors, hangs up."""


class NotRunning(GpumemError):
    code = NOT_RUNNING


class NotFound(GpumemError):
    code = NOT_FOUND


class Exists(GpumemError):
    code = EXISTS


class PermissionDenied(GpumemError):
    code = PERMISSION


class NoMemory(GpumemError):
    code = NO_MEMORY


class Uncorrectable(GpumemError):
    code = UNCORRECTABLE


class Busy(GpumemError):
    code = BUSY


class InvalidState(GpumemError):
    code = INVALID_STATE


class InternalError(GpumemError):
    code = INTERNAL


_BY_CODE = {cls.code: cls for cls in (UsageError, NotRunning, NotFound, Exists,
                                      PermissionDenied, NoMemory, Uncorrectable, Busy,
                                      InvalidState, InternalError)}


def error_from_wire(err: dict) -> GpumemError:
    """Rebuild the typed exception a daemon answered with."""
    code = err.get("code", INTERNAL)
    cls = _BY_CODE.get(code, InternalError)
    exc = cls(str(err.get("message", "unknown error")), details=err.get("details") or {})
    if cls is InternalError and code != INTERNAL:
        exc.message = f"{exc.message} (unknown error code {code})"
    return exc
