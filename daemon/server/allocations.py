"""The handlers of the namespace and data ops: ls, info, create, mkdir, symlink, readlink,
rm, durable, open, close, attach, detach, seal, export_dmabuf, and of user metadata
(meta_list, meta_get, meta_set, meta_rm). Each hands its checked arguments to one verb (or
runs its plan: daemon/verbs/plan.py) and shapes the answer (docs/protocol.md has the table)."""
from __future__ import annotations

import base64

from ..verbs.plan import run
from .call import Call, Reply, administrator, require_administrator


async def ls(call: Call) -> Reply:
    """With `limit` or `after`, one page and the `next` cursor (daemon/core/listing.py); without,
    the whole listing in one answer, as older clients expect."""
    a, cred, queries = call.args, call.session.cred, call.verbs.queries
    if a["limit"] is None and a["after"] is None:
        return {"entries": queries.listdir(a["path"], cred, recursive=a["recursive"])}, []
    entries, next_page = queries.list_page(
        a["path"], cred, recursive=a["recursive"], after=a["after"], limit=a["limit"])
    return {"entries": entries, "next": next_page}, []


async def info(call: Call) -> Reply:
    return call.verbs.queries.info(call.args["path"], call.session.cred), []


async def create(call: Call) -> Reply:
    a = call.args
    return await run(call.verbs.names.create(
        a["path"], call.session.cred, size=a["size"], durable=a["durable"], mode=a["mode"],
        device=a["device"], ecc=a["ecc"], exist_ok=a["exist_ok"], session=call.session,
        lease=a["lease"], metadata=a["metadata"])), []


async def mkdir(call: Call) -> Reply:
    a = call.args
    return call.verbs.names.mkdir(a["path"], call.session.cred, mode=a["mode"],
                                  parents=a["parents"]), []


async def link(call: Call) -> Reply:
    a = call.args
    return call.verbs.names.link(a["target"], a["path"], call.session.cred), []


async def symlink(call: Call) -> Reply:
    a = call.args
    return call.verbs.names.symlink(a["path"], a["target"], call.session.cred), []


async def readlink(call: Call) -> Reply:
    return call.verbs.names.readlink(call.args["path"], call.session.cred), []


async def rm(call: Call) -> Reply:
    a = call.args
    removed = call.verbs.names.remove(a["path"], call.session.cred, recursive=a["recursive"],
                                      force=a["force"])
    return {"removed": removed}, []


async def durable(call: Call) -> Reply:
    a = call.args
    return await run(call.verbs.durability.set_durable(a["path"], call.session.cred,
                                                       a["durable"])), []


async def rename(call: Call) -> Reply:
    a = call.args
    return call.verbs.names.rename_path(a["path"], a["to"], call.session.cred,
                                        replace=not a["no_replace"]), []


async def resize(call: Call) -> Reply:
    a = call.args
    return call.verbs.data.resize_path(a["path"], call.session.cred, a["size"],
                                       session=call.session), []


async def open_(call: Call) -> Reply:
    holder, fds, node = call.verbs.handles.open(call.args["path"], call.session.cred,
                                                call.session, call.args["mode"],
                                                call.args["regions"], call.args["extents"])
    return {"handle": holder.id, "info": node,
            "backend": call.verbs.reports.backend_name}, fds


async def read(call: Call) -> Reply:
    """Bytes by copy, base64 in the answer: how a caller with read permission reads where
    an fd would let it write (the cuda backend; docs/security.md). At most READ_COPY_BYTES a
    request, so the answer stays small and within the send limits."""
    a = call.args
    data = call.verbs.data.copy_out(a["path"], call.session.cred, a["offset"], a["length"],
                                    expect_id=a["id"])
    return {"offset": a["offset"], "bytes": len(data),
            "data": base64.b64encode(data).decode("ascii")}, []


async def close(call: Call) -> Reply:
    a = call.args
    return await run(call.verbs.handles.close(call.session, a["handle"], written=a["written"],
                                              restored=a["restored"])), []


async def refill(call: Call) -> Reply:
    """A handle to fill an allocation from a snapshot (daemon/verbs/refill.py)."""
    a = call.args
    holder, fds, node = call.verbs.refill.begin_refill(
        a["path"], call.session.cred, call.session, size=a["size"], mode=a["mode"],
        ecc=a["ecc"], durable=a["durable"], device=a["device"], force=a["force"],
        unsealed=a["unsealed"], metadata=a["metadata"], extents=a["extents"])
    return {"handle": holder.id, "info": node,
            "backend": call.verbs.reports.backend_name}, fds


async def meta_list(call: Call) -> Reply:
    return call.verbs.metadata.meta_list(call.args["path"], call.session.cred), []


async def meta_get(call: Call) -> Reply:
    a = call.args
    return call.verbs.metadata.meta_get(a["path"], a["key"], call.session.cred), []


async def meta_set(call: Call) -> Reply:
    a = call.args
    return call.verbs.metadata.meta_set(a["path"], a["key"], a["value"], call.session.cred,
                                        create=a["create"], replace=a["replace"]), []


async def meta_rm(call: Call) -> Reply:
    a = call.args
    return call.verbs.metadata.meta_rm(a["path"], a["key"], call.session.cred), []


async def revoke(call: Call) -> Reply:
    """The owner (or the administrator) takes the read locks of every other session."""
    cred = call.session.cred
    alloc = call.verbs.queries.lookup_allocation(call.args["path"], cred)
    if alloc.uid != cred.uid:
        require_administrator(call, f"revoke the readers of '{alloc.path}', which uid "
                                    f"{alloc.uid} owns")
    return {"revoked": call.verbs.handles.revoke_readers(alloc, cred, call.session)}, []


async def attach(call: Call) -> Reply:
    holder, fds, node = call.verbs.handles.attach(call.args["path"], call.session.cred,
                                                  call.session, call.args["mode"],
                                                  call.args["regions"], call.args["extents"])
    return {"handle": holder.id, "info": node,
            "backend": call.verbs.reports.backend_name}, fds


async def detach(call: Call) -> Reply:
    return await run(call.verbs.handles.detach(call.session, call.args["handle"])), []


async def seal(call: Call) -> Reply:
    return await run(call.verbs.handles.seal(call.args["path"], call.session.cred,
                                             call.session)), []


async def export_dmabuf(call: Call) -> Reply:
    fd, node = call.verbs.handles.export_dmabuf(call.args["path"], call.session.cred)
    return {"info": node, "offset": 0, "size": node.get("capacity")}, [fd]


async def snapshot_report(call: Call) -> Reply:
    """A client's account of a snapshot create, restore or verify (daemon/verbs/refill.py)."""
    a = call.args
    report = {k: a[k] for k in ("action", "snapshot", "location", "result", "bytes",
                                "bytes_written", "duration_ms", "allocations",
                                "incremental", "io")}
    return call.verbs.records.record_snapshot(call.session.cred, report, a["paths"] or [],
                                              administrator(call)), []


async def changes(call: Call) -> Reply:
    """What changed since the last snapshot's reset, under a read handle."""
    return call.verbs.handles.changes(call.session, call.args["handle"], call.args["reset"]), []
