"""The handlers of the namespace and data ops: ls, info, create, mkdir, symlink, readlink,
rm, durable, open, close, attach, detach, seal, export_dmabuf, and of user metadata
(meta_list, meta_get, meta_set, meta_rm). Each hands its checked arguments to one
manager verb and shapes the answer (docs/protocol.md has the table)."""
from __future__ import annotations

import base64

from .. import offload
from .call import Call, Reply, administrator, require_administrator


async def ls(call: Call) -> Reply:
    """With `limit` or `after`, one page and the `next` cursor (daemon/listing.py); without,
    the whole listing in one answer, as older clients expect."""
    a, cred = call.args, call.session.cred
    if a["limit"] is None and a["after"] is None:
        return {"entries": call.manager.listdir(a["path"], cred,
                                                 recursive=a["recursive"])}, []
    entries, next_page = call.manager.list_page(
        a["path"], cred, recursive=a["recursive"], after=a["after"], limit=a["limit"])
    return {"entries": entries, "next": next_page}, []


async def info(call: Call) -> Reply:
    return call.manager.info(call.args["path"], call.session.cred), []


async def create(call: Call) -> Reply:
    a, m = call.args, call.manager
    request = dict(size=a["size"], durable=a["durable"], mode=a["mode"], device=a["device"],
                   ecc=a["ecc"], exist_ok=a["exist_ok"], session=call.session,
                   lease=a["lease"], metadata=a["metadata"])
    if not a["durable"] or a["lease"]:
        return m.create(a["path"], call.session.cred, **request), []
    # Durable: the deposit goes to the keeper from a worker thread, so that a stalled keeper
    # holds this request only, never the loop (manager.prepare_create has the steps).
    async with offload.deposits():
        prepared = m.prepare_create(a["path"], call.session.cred, **request)
        if prepared is not None:
            try:
                await offload.keeper_call(m.custody.send_begin(m.custody.handover(
                    prepared.alloc)))
            except BaseException:
                m.abandon(prepared)
                raise
        return m.create(a["path"], call.session.cred, prepared=prepared, **request), []


async def mkdir(call: Call) -> Reply:
    a = call.args
    return call.manager.mkdir(a["path"], call.session.cred, mode=a["mode"],
                              parents=a["parents"]), []


async def link(call: Call) -> Reply:
    a = call.args
    return call.manager.link(a["target"], a["path"], call.session.cred), []


async def symlink(call: Call) -> Reply:
    a = call.args
    return call.manager.symlink(a["path"], a["target"], call.session.cred), []


async def readlink(call: Call) -> Reply:
    return call.manager.readlink(call.args["path"], call.session.cred), []


async def rm(call: Call) -> Reply:
    a = call.args
    removed = call.manager.remove(a["path"], call.session.cred, recursive=a["recursive"],
                                  force=a["force"])
    return {"removed": removed}, []


async def durable(call: Call) -> Reply:
    a, m = call.args, call.manager
    if not a["durable"]:
        return m.set_durable(a["path"], call.session.cred, False), []
    async with offload.deposits():          # as create: the deposit off the loop
        deposit = m.prepare_durable(a["path"], call.session.cred)
        if deposit is not None:
            await offload.keeper_call(m.custody.send_begin(deposit))
        try:
            return m.set_durable(a["path"], call.session.cred, True, deposited=deposit), []
        except BaseException:
            if deposit is not None:
                m.custody.withdraw_quietly(deposit.key)
            raise


async def open_(call: Call) -> Reply:
    holder, fd, node = call.manager.open(call.args["path"], call.session.cred, call.session,
                                         call.args["mode"])
    return {"handle": holder.id, "info": node, "backend": call.manager.backend_name}, [fd]


async def read(call: Call) -> Reply:
    """Bytes by copy, base64 in the answer: how a caller with read permission reads where
    an fd would let it write (the cuda backend; docs/security.md). At most READ_COPY_BYTES a
    request, so the answer stays small and within the send limits."""
    a = call.args
    data = call.manager.copy_out(a["path"], call.session.cred, a["offset"], a["length"])
    return {"offset": a["offset"], "bytes": len(data),
            "data": base64.b64encode(data).decode("ascii")}, []


async def close(call: Call) -> Reply:
    # A handle that wrote has its parity encoded on a worker thread while it is still held
    # (no other writer, the memory stays); the loop serves everyone else meanwhile.
    m = call.manager
    if m.was_revoked(call.session, call.args["handle"]):
        return {"revoked": True}, []
    holder = m.handle(call.session, call.args["handle"])
    restored = call.args["restored"]
    if m.refill_of(holder.id) is not None and restored is None:
        m.abort_refill(call.session, holder)          # the restore gave up: lost again
        return {}, []
    job = m.parity_job(holder)
    await offload.parity_work(job)
    if m.refill_of(holder.id) is not None:
        m.integrity.finish(job)
        return {"info": m.finish_refill(call.session, holder, restored.get("damaged", []))}, []
    m.close_handle(call.session, call.args["handle"], written=call.args["written"],
                   parity=job, planned=True)
    return {}, []


async def refill(call: Call) -> Reply:
    """A handle to fill an allocation from a snapshot (daemon/refill.py)."""
    a = call.args
    holder, fd, node = call.manager.begin_refill(
        a["path"], call.session.cred, call.session, size=a["size"], mode=a["mode"],
        ecc=a["ecc"], durable=a["durable"], device=a["device"], force=a["force"],
        unsealed=a["unsealed"], metadata=a["metadata"])
    return {"handle": holder.id, "info": node, "backend": call.manager.backend_name}, [fd]


async def meta_list(call: Call) -> Reply:
    return call.manager.meta_list(call.args["path"], call.session.cred), []


async def meta_get(call: Call) -> Reply:
    a = call.args
    return call.manager.meta_get(a["path"], a["key"], call.session.cred), []


async def meta_set(call: Call) -> Reply:
    a = call.args
    return call.manager.meta_set(a["path"], a["key"], a["value"], call.session.cred,
                                 create=a["create"], replace=a["replace"]), []


async def meta_rm(call: Call) -> Reply:
    a = call.args
    return call.manager.meta_rm(a["path"], a["key"], call.session.cred), []


async def revoke(call: Call) -> Reply:
    """The owner (or the administrator) takes the read locks of every other session."""
    m, cred = call.manager, call.session.cred
    alloc = m.lookup_allocation(call.args["path"], cred)
    if alloc.uid != cred.uid:
        require_administrator(call, f"revoke the readers of '{alloc.path}', which uid "
                                    f"{alloc.uid} owns")
    return {"revoked": m.revoke_readers(alloc, cred, call.session)}, []


async def attach(call: Call) -> Reply:
    holder, fd, node = call.manager.attach(call.args["path"], call.session.cred,
                                           call.session, call.args["mode"])
    return {"handle": holder.id, "info": node, "backend": call.manager.backend_name}, [fd]


async def detach(call: Call) -> Reply:
    m, handle = call.manager, call.args["handle"]
    if m.was_revoked(call.session, handle):
        return {"info": None, "revoked": True}, []
    job = m.detach_job(call.session, handle)      # a writer's seal: its parity off the loop
    await offload.parity_work(job)
    return {"info": m.detach(call.session, handle, parity=job, planned=True)}, []


async def seal(call: Call) -> Reply:
    m, a = call.manager, call.args
    job = m.seal_job(a["path"], call.session.cred, call.session)   # as detach
    await offload.parity_work(job)
    return m.seal(a["path"], call.session.cred, call.session, parity=job, planned=True), []


async def export_dmabuf(call: Call) -> Reply:
    fd, node = call.manager.export_dmabuf(call.args["path"], call.session.cred)
    return {"info": node, "offset": 0, "size": node["capacity"]}, [fd]


async def snapshot_report(call: Call) -> Reply:
    """A client's account of a snapshot create, restore or verify (daemon/refill.py)."""
    a = call.args
    report = {k: a[k] for k in ("action", "snapshot", "location", "result", "bytes",
                                "bytes_written", "duration_ms", "allocations",
                                "incremental", "io")}
    return call.manager.record_snapshot(call.session.cred, report, a["paths"] or [],
                                        administrator(call)), []


async def changes(call: Call) -> Reply:
    """What changed since the last snapshot's reset, under a read handle (handles.py)."""
    return call.manager.changes(call.session, call.args["handle"], call.args["reset"]), []
