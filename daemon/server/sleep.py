"""The handlers of sleep, wake and remap (issue 28, daemon/verbs/sleep.py): an allocation's
bytes to host memory and back, and an attachment mapping the new memory where it kept its
address (docs/protocol.md has the table)."""
from __future__ import annotations

from ..verbs.plan import run
from .call import Call, Reply


async def sleep(call: Call) -> Reply:
    a = call.args
    return await run(call.verbs.sleep.sleep(a["path"], call.session.cred, call.session,
                                            a["parked"])), []


async def wake(call: Call) -> Reply:
    return await run(call.verbs.sleep.wake(call.args["path"], call.session.cred)), []


async def remap(call: Call) -> Reply:
    a = call.args
    holder, fds, node = call.verbs.sleep.remap(call.session, a["handle"], call.session.cred,
                                               regions=a["regions"], extents=a["extents"])
    return {"handle": holder.id, "info": node,
            "backend": call.verbs.reports.backend_name}, fds
