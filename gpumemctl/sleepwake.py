"""Sleep and wake at the same address (issue 28, part 1): `Client.sleep(names)` and
`Client.wake(names)`, `gpumemctl.sleep(names)` and `gpumemctl.wake(names)`.

An inference engine that shares a GPU between models puts one to sleep: its memory goes back
to the device while gpumemd keeps its bytes in host memory, and on wake they come back at the
same virtual addresses in this process, so pointers, tensors and captured CUDA graphs stay
valid (docs/engines.md).

gpumemd refuses to put to sleep an allocation anything holds (Busy: exit code 9), except the
attachments of the calling process named in op `sleep`'s `parked`: attachments whose mappings
the process has let go while keeping their address ranges (Attachment.park). So sleep parks
every live attachment of this process to the allocation, whichever connection made it
(gpumemctl.attach.live: gpumemctl.tensors.load attaches each shard on a connection of its
own), then asks; should the daemon refuse, what was parked is mapped again (the memory never
left) and the error raised. Wake asks first, then resumes them (op `remap`: the memory the
allocation has now, mapped where the old was).

Between the two, the parked attachments' read, write and exports raise InvalidState, and
memory reached through pointers made before faults (a kernel: an illegal address; the CPU:
SIGSEGV), as it would for memory freed.
"""
from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .attach import Attachment
    from .client import Client
    from .protocol.replies import Allocation


class Slept(TypedDict):
    """Op `sleep`'s answer: `bytes` moved to the host tier (0 when it was asleep already:
    `already`) in `seconds`, and where those went, seconds per step of the copy (`phases`)."""
    info: Allocation
    bytes: int
    seconds: float
    already: bool
    phases: NotRequired[dict[str, float]]


class Verified(TypedDict):
    """The blocks checked as the bytes came back (the allocation's ECC, docs/ecc.md)."""
    blocks: int
    clean: int
    corrected: int
    uncorrectable: int


class Woken(Slept):
    """Op `wake`'s answer: as sleep's, `bytes` brought back to the device, and `verify`."""
    verify: Verified


def sleep(client: Client, names: str | list[str]) -> list[Slept]:
    """Put each allocation to sleep in turn, parking this process's attachments of it first;
    the first refusal is raised (the names before it stay asleep)."""
    return [_sleep_one(client, name) for name in _listed(names)]


def wake(client: Client, names: str | list[str]) -> list[Woken]:
    """Wake each allocation in turn and map this process's attachments of it again, at the
    addresses they kept."""
    return [_wake_one(client, name) for name in _listed(names)]


def sleep_names(names: str | list[str], socket: str | None = None) -> list[Slept]:
    """gpumemctl.sleep(): Client.sleep on a connection of its own."""
    from .client import Client
    with Client(socket, client_name="gpumemctl.sleep") as c:
        return sleep(c, names)


def wake_names(names: str | list[str], socket: str | None = None) -> list[Woken]:
    """gpumemctl.wake(): Client.wake on a connection of its own."""
    from .client import Client
    with Client(socket, client_name="gpumemctl.wake") as c:
        return wake(c, names)


def _listed(names: str | list[str]) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def _sleep_one(client: Client, name: str) -> Slept:
    parked: list[Attachment] = []
    handles: list[int] = []
    try:
        for a in _attachments(client, name):
            handles.append(a.park())
            parked.append(a)
        # No timeout: the bytes are copied to host memory first (seconds for a large model).
        return client._long_call("sleep", path=name, parked=handles)
    except BaseException:
        _resume_quietly(parked)
        raise


def _resume_quietly(parked: list[Attachment]) -> None:
    """Map back what was parked for a sleep that did not happen: the allocation is awake.
    The sleep's error is the one to raise; an attachment that cannot be mapped again stays
    parked, and says so when used (its resume() may be called again)."""
    for a in parked:
        with contextlib.suppress(Exception):
            a.resume()


def _wake_one(client: Client, name: str) -> Woken:
    woken: Woken = client._long_call("wake", path=name)
    failure: Exception | None = None
    for a in _attachments(client, name, node=woken["info"]):
        try:
            a.resume()
        except Exception as exc:  # noqa: BLE001 - the others are mapped again all the same
            failure = failure or exc
    if failure is not None:
        raise failure
    return woken


def _attachments(client: Client, name: str, node: Mapping[str, object] | None = None
                 ) -> list[Attachment]:
    """This process's live attachments of the allocation `name` names (the node's id
    decides: another name of it, a link, or a name given another way finds the same), made
    through the same daemon. No module gpumemctl.attach loaded: nothing is attached."""
    attach = sys.modules.get(f"{__package__}.attach")
    if attach is None:
        return []
    mine = [a for a in attach.live(client.socket_path) if not a.detached]
    if not mine:
        return []
    node = node or client.info(name)
    return [a for a in mine if a.info.get("id") == node.get("id")]
