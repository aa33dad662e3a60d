"""The handler of op `refill_written` (issue 29): a refill's client reporting, while it still
writes, the bytes it has written for good, whose parity the daemon then encodes off the loop
(daemon/verbs/refill.py, `RefillVerbs.report_written`; docs/protocol.md has the row)."""
from __future__ import annotations

from ..verbs.plan import run
from .call import Call, Reply


async def refill_written(call: Call) -> Reply:
    a = call.args
    return await run(call.verbs.refill.report_written(call.session, a["handle"],
                                                      a["ranges"])), []
