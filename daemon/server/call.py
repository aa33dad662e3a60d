"""What an op handler is given (`Call`) and what it returns (`Reply`), and the rules of what a
session may see of other users' events and nodes, shared by `events`, `subscribe`, `status`
and `check`."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpumemctl.protocol import PermissionDenied

from ..core.events import visible_to
from ..core.nodes import Node
from ..core.sessions import Session

if TYPE_CHECKING:
    from ..verbs import Verbs
    from .service import Server

# The answer's result (a plain dict, or a reply type of gpumemctl.protocol.replies) and the
# fds that ride with it.
Reply = tuple[Mapping[str, Any], list[int]]
ProgressSend = Callable[[dict], Awaitable[None]]


@dataclasses.dataclass
class Call:
    """One request on its way through its handler."""
    server: Server
    session: Session
    rid: Any                            # the request's id, echoed in every frame for it
    args: dict[str, Any]                # checked against the op's schema, defaults filled
    progress: ProgressSend | None = None    # set when the op sends progress frames

    @property
    def verbs(self) -> Verbs:
        return self.server.verbs


def privileged(session: Session) -> bool:
    """Root and the daemon's own user see everything."""
    return session.cred.is_root or session.cred.uid == os.geteuid()


def administrator(call: Call) -> bool:
    """Root, the daemon's own user, or a member of the configured admin_group: who may
    control the scrub and recover other users' allocations (docs/security.md)."""
    gid = call.server.admin_gid
    return privileged(call.session) or (gid is not None and call.session.cred.in_group(gid))


def require_administrator(call: Call, what: str) -> None:
    if not administrator(call):
        raise PermissionDenied(f"permission denied: only root, the daemon's user or a member "
                               f"of the admin_group (docs/config.md) may {what}")


def own_uid_unless_privileged(session: Session) -> int | None:
    """The uid a query is limited to for this session: None (no limit) for the privileged."""
    return None if privileged(session) else session.cred.uid


def event_visible(call: Call, event: dict) -> bool:
    """Root and the daemon's user see every event; others what events.visible_to shows
    them (their own, the daemon's, and for the administrator every user's reports)."""
    return privileged(call.session) or visible_to(event, call.session.cred.uid,
                                                  administrator=administrator(call))


def node_visible(call: Call, node: Node) -> bool:
    """Whether a `changed` frame may name this node to the session: where it could `info` it
    (search permission on every directory above it; the privileged see all). A removed node
    is judged by the directories it was in."""
    return privileged(call.session) or call.verbs.queries.may_search_to(node, call.session.cred)
