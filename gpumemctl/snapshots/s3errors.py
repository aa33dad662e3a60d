"""obstore's exceptions as the project's errors (gpumemctl/snapshots/s3.py): one line that
says what was being done and why it failed (the S3 error code, an HTTP status, the cause of
a connection failure), with the exit code of its kind: a missing bucket 4, no permission or
credentials refused 6, anything else 2."""
from __future__ import annotations

import re

from obstore.exceptions import BaseError, PermissionDeniedError, UnauthenticatedError

from ..protocol import GpumemError, NotFound, PermissionDenied, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .s3 import S3Store

OBSTORE_ERRORS = (BaseError, OSError)     # obstore raises FileNotFoundError, OSError too


def no_bucket(exc: BaseException) -> bool:
    return "<Code>NoSuchBucket</Code>" in str(exc)


def missing(exc: BaseException) -> bool:
    """A missing object (not a missing bucket, which S3 reports with the same 404)."""
    return isinstance(exc, FileNotFoundError) and not no_bucket(exc)


def http_status(text: str) -> int | None:
    m = re.search(r"status code: (\d{3})", text) or re.search(r"status: (\d{3})", text)
    return int(m.group(1)) if m else None


def _endpoint(text: str) -> str:
    m = re.search(r"Error performing \w+ (https?://[^/\s]+)", text)
    return m.group(1) if m else "the S3 endpoint"


def _cause(text: str) -> str | None:
    """The cause, deepest in obstore's debug text: an OS error's message, a resolver's
    error, a connector's label, or a TLS error's name."""
    for pattern in (r'message: "([^"]*)"', r'error: "([^"]*)"', r'ConnectError\(\s*"([^"]*)"'):
        m = re.search(pattern, text)
        if m:
            return " ".join(m.group(1).split())
    m = re.search(r"error: (\w+)\(\s*(\w+),?\s*\)", text)
    return f"{m.group(1)}({m.group(2)})" if m else None


def _retries(text: str) -> str:
    m = re.search(r"after (\d+) retries", text.split("\n\nDebug source:")[0])
    return f" (after {m.group(1)} retries)" if m else ""


def _detail(exc: BaseException) -> str:
    """What went wrong, in one line, from obstore's many-line message."""
    text = str(exc)
    head = text.split("\n\nDebug source:")[0]
    code = re.search(r"<Code>([^<]*)</Code>", text)
    if code:
        message = re.search(r"<Message>([^<]*)</Message>", text)
        return f"{code.group(1)}: {message.group(1)}" if message else code.group(1)
    status = re.search(r"status code: (\d{3}[^:\n]*)", head)
    if status:
        return f"HTTP {status.group(1).strip()}"
    line = re.sub(r"^Generic \w+ error: ", "", " ".join(head.split()))
    if " - " in line:
        line = line.rsplit(" - ", 1)[1]
    cause = _cause(text)
    return (f"{line}: {cause}" if cause else line)[:300] + _retries(text)


def error_of(exc: BaseException, what: str, location: str, bucket: str) -> GpumemError:
    text = str(exc)
    if no_bucket(exc):
        return NotFound(f"snapshot store {location}: bucket {bucket!r} does not exist")
    if "Missing AccessKeyId" in text or "Missing SecretAccessKey" in text:
        return UsageError(f"{what}: incomplete AWS credentials ({_detail(exc)}): set both "
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if "169.254.169.254" in text or "169.254.170.2" in text:
        return UsageError(f"{what}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY; instance credentials: {_detail(exc)})")
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError) \
            or http_status(text) in (401, 403):
        return PermissionDenied(f"permission denied: {what} ({_detail(exc)})")
    if "kind: Connect" in text or "tcp connect error" in text or "dns error" in text:
        return UsageError(f"{what}: cannot reach {_endpoint(text)}: "
                          f"{_cause(text) or 'error sending request'}{_retries(text)}")
    return UsageError(f"{what}: {_detail(exc)}")


class Errors:
    """`with store._errors(what):` turns obstore's exceptions into the project's."""

    def __init__(self, store: S3Store, what: str):
        self.store, self.what = store, what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and isinstance(exc, OBSTORE_ERRORS):
            raise error_of(exc, self.what, self.store.location, self.store.bucket) from None
