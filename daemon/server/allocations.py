"""The handlers of the namespace and data ops: ls, info, create, mkdir, rm, durable, open,
close, attach, detach, seal, export_dmabuf. Each hands its checked arguments to one
manager verb and shapes the answer (docs/protocol.md has the table)."""
from __future__ import annotations

from .call import Call, Reply


async def ls(call: Call) -> Reply:
    a = call.args
    entries = call.manager.listdir(a["path"], call.session.cred, recursive=a["recursive"])
    return {"entries": entries}, []


async def info(call: Call) -> Reply:
    return call.manager.info(call.args["path"], call.session.cred), []


async def create(call: Call) -> Reply:
    a = call.args
    return call.manager.create(
        a["path"], call.session.cred, size=a["size"], durable=a["durable"], mode=a["mode"],
        device=a["device"], ecc=a["ecc"], exist_ok=a["exist_ok"], session=call.session,
        lease=a["lease"]), []


async def mkdir(call: Call) -> Reply:
    a = call.args
    return call.manager.mkdir(a["path"], call.session.cred, mode=a["mode"],
                              parents=a["parents"]), []


async def rm(call: Call) -> Reply:
    a = call.args
    removed = call.manager.remove(a["path"], call.session.cred, recursive=a["recursive"],
                                  force=a["force"])
    return {"removed": removed}, []


async def durable(call: Call) -> Reply:
    a = call.args
    return call.manager.set_durable(a["path"], call.session.cred, a["durable"]), []


async def open_(call: Call) -> Reply:
    holder, fd, node = call.manager.open(call.args["path"], call.session.cred, call.session,
                                         call.args["mode"])
    return {"handle": holder.id, "info": node, "backend": call.manager.backend_name}, [fd]


async def close(call: Call) -> Reply:
    call.manager.close_handle(call.session, call.args["handle"],
                              written=call.args["written"])
    return {}, []


async def attach(call: Call) -> Reply:
    holder, fd, node = call.manager.attach(call.args["path"], call.session.cred,
                                           call.session, call.args["mode"])
    return {"handle": holder.id, "info": node, "backend": call.manager.backend_name}, [fd]


async def detach(call: Call) -> Reply:
    return {"info": call.manager.detach(call.session, call.args["handle"])}, []


async def seal(call: Call) -> Reply:
    return call.manager.seal(call.args["path"], call.session.cred, call.session), []


async def export_dmabuf(call: Call) -> Reply:
    fd, node = call.manager.export_dmabuf(call.args["path"], call.session.cred)
    return {"info": node, "offset": 0, "size": node["capacity"]}, [fd]
