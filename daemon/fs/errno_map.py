"""Protocol errors as errno values, for the FUSE layer's boundary (daemon/fs/).

The verbs raise only `gpumemctl.protocol` errors. The FUSE operations turn them
into `FUSEError(errno_for(exc))` and nothing else; the socket server sends the same errors as
numbered protocol errors. One class has one errno here. Where POSIX wants a more precise errno
than the class gives, the verb names it in the error's details, as `details["errno"]`
(a name such as "ENOTEMPTY", not a number: details travel over the socket as JSON, and errno
numbers differ between platforms), and that name wins:

| operation                   | case                                | class            | errno     |
| --------------------------- | ----------------------------------- | ---------------- | --------- |
| any taking a parent id      | the parent is an allocation         | UsageError       | ENOTDIR   |
| rename                      | directory over an allocation        | UsageError       | ENOTDIR   |
| rename                      | allocation over a directory         | UsageError       | EISDIR    |
| rename, rmdir_child         | directory not empty                 | Exists           | ENOTEMPTY |
| rmdir_child                 | not a directory                     | UsageError       | ENOTDIR   |
| unlink_child                | a directory                         | UsageError       | EISDIR    |
| setattr                     | chmod/chown/utimes by a non-owner   | PermissionDenied | EPERM     |
| rename                      | into its own subtree                | UsageError       | EINVAL    |
| write_at, resize            | device full                         | NoMemory         | ENOSPC    |
| write_at, resize, create    | more than any device's total        | NoMemory         | EFBIG     |
| write_at, resize, chown     | over the owner's quota (quotas.py)  | QuotaExceeded    | EDQUOT    |

EXDEV never arises: the namespace is one filesystem, so a rename across directories is always
a move. Hard links are EPERM and symlinks ENOTSUP: the FUSE layer answers those itself.
"""
from __future__ import annotations

import errno

from gpumemctl.protocol import (
    Busy,
    Exists,
    GpumemError,
    InternalError,
    InvalidState,
    NoMemory,
    NotFound,
    NotRunning,
    PermissionDenied,
    Uncorrectable,
    UsageError,
)

ERRNO_FOR_ERROR: dict[type[GpumemError], int] = {
    NotFound: errno.ENOENT,
    Exists: errno.EEXIST,
    PermissionDenied: errno.EACCES,
    NoMemory: errno.ENOSPC,            # a write past the capacity on a full device
    Busy: errno.EBUSY,
    UsageError: errno.EINVAL,          # a bad name, size, mode or offset
    InvalidState: errno.EIO,           # lost memory: reads fail, never return wrong bytes
    Uncorrectable: errno.EIO,          # damaged ranges read as EIO (docs/design.md, "Lifetimes")
    NotRunning: errno.EIO,
    InternalError: errno.EIO,
}


def errno_for(exc: GpumemError) -> int:
    """The errno for a protocol error: details["errno"] if it names one, else the nearest
    class in ERRNO_FOR_ERROR (subclasses such as ProtocolError inherit), else EIO."""
    name = exc.details.get("errno") if isinstance(exc.details, dict) else None
    if isinstance(name, str) and isinstance(getattr(errno, name, None), int):
        return getattr(errno, name)
    for cls in type(exc).__mro__:
        if cls in ERRNO_FOR_ERROR:
            return ERRNO_FOR_ERROR[cls]
    return errno.EIO
