"""The streaming data paths of `Client.read_to` and `Client.write_from` (the CLI's `read` and
`write`, `save`'s tensor bytes): an allocation's bytes to or from a file object, through the
fd the daemon hands out where it does, by copy through the socket where it does not (a
reader on the cuda backend: docs/security.md). An OSError of the local file comes out with
that file's name, so that the CLI's one line can say which (docs/cli.md, "Local files")."""
from __future__ import annotations

from .protocol import InvalidState, PermissionDenied, UsageError, out_of_range
from .protocol.defaults import READ_COPY_BYTES

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO

    from .client import Client

    Progress = Callable[[int, int], None]


def read_to(client: Client, path: str, out: BinaryIO, offset: int = 0,
            length: int | None = None, progress: Progress | None = None) -> int:
    """Client.read_to."""
    try:
        h = client.open(path, "r")
    except (PermissionDenied, InvalidState) as exc:    # no fd for this reader, or asleep
        if not exc.details.get("by_copy"):
            raise
        return _copy_to(client, path, out, offset, length, progress)
    with h:
        length = h.size - offset if length is None else length
        h._check_range(offset, length)
        try:
            return h.memory.read_to(out, offset, length,
                                    lambda done: progress and progress(done, length))
        except OSError as exc:
            raise _naming(exc, out) from None


def _copy_to(client: Client, path: str, out: BinaryIO, offset: int, length: int | None,
             progress: Progress | None) -> int:
    node = client.info(path)
    size = (node["size"] if node["type"] == "allocation" else None) or 0
    length = max(size - offset, 0) if length is None else length
    if offset < 0 or length < 0 or offset + length > size:
        raise out_of_range(path, offset, length, size, writing=False)
    done = 0
    while done < length:
        data = client.read_copy(path, offset + done, min(READ_COPY_BYTES, length - done))
        if not data:
            break
        try:
            out.write(data)
        except OSError as exc:
            raise _naming(exc, out) from None
        done += len(data)
        if progress:
            progress(done, length)
    return done


def write_from(client: Client, path: str, src: BinaryIO, offset: int = 0,
               progress: Progress | None = None, total: int | None = None) -> int:
    """Client.write_from."""
    with client.open(path, "rw") as h:
        if total is not None:
            h._check_range(offset, total, writing=True)
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done = n
            if progress:
                progress(done, total or 0)

        try:
            too_long = h.memory.write_from(src, offset, h.size - offset, advance)
        except OSError as exc:
            raise _naming(exc, src) from None
        finally:
            if done:
                h._note_write(offset, done)
        if too_long:
            raise UsageError(f"input is larger than '{h.info['path']}' from offset "
                             f"{offset} (size {h.size}); nothing past the end was written; "
                             f"make room first: gpumemctl write --grow (it reads the input "
                             "first to know its length)")
        return done


def _naming(exc: OSError, f) -> OSError:
    """An OSError of the local file `f` (read_to's out, write_from's src) with that file's
    name, so that the CLI's one line can say which file ("<stdout>" for sys.stdout)."""
    name = getattr(f, "name", None)
    if exc.filename is None and isinstance(name, str):
        exc.filename = name
    return exc
