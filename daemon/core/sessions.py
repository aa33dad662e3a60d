"""A session is one client connection: its credentials and what it holds.

When the connection ends (the client closed it, or the client's process died and the kernel
closed it), the handle verbs release everything the session held.
"""
from __future__ import annotations

import dataclasses
import itertools

from .containers import UNKNOWN, Origin
from .permissions import Credentials

_ids = itertools.count(1)


@dataclasses.dataclass(eq=False)
class Session:
    cred: Credentials
    id: int = dataclasses.field(default_factory=lambda: next(_ids))
    holders: dict = dataclasses.field(default_factory=dict)   # holder id -> Holder
    client: str = ""
    closed: bool = False
    # Handles and attachments the allocation's owner revoked (HandleVerbs.revoke_readers):
    # their close or detach answers quietly, as if they were still held.
    revoked: set = dataclasses.field(default_factory=set)
    # The client's cgroup and container, read from /proc/PID/cgroup once at the hello
    # (daemon/core/containers.py); every holder of the session carries it.
    origin: Origin = UNKNOWN
