"""The handler of `compact` (docs/protocol.md): the administrator's compaction of slabs
(docs/storage.md, "Compaction and fragmentation"). The pass is a plan: the event loop
serves everyone else between its slices."""
from __future__ import annotations

from ..verbs.plan import run
from .call import Call, Reply, require_administrator


async def compact(call: Call) -> Reply:
    """Only the administrator: a pass moves every owner's objects (within their own slabs),
    and its answer names them."""
    require_administrator(call, "compact the slabs")
    return await run(call.verbs.compaction.compact(call.session.cred,
                                                   call.args["dry_run"])), []
