"""What the commands scripts run in loops do, apart from how their arguments are read.

`ls`, `info`, `status`, `create`, `mkdir`, `rm`, `durable`, `transient`, `write` and `read`
are declared (parameters, help) in gpumemctl/commands.py with typer, and their bodies live
here, with no typer or click import: gpumemctl/fastargs.py runs a plain invocation of them
without loading typer at all, typer runs every other one, and both call the same function
through `invoke` (docs/cli.md, "Start-up"). Each body takes the parameters its typer
declaration names, with the same defaults (tests/unit/test_cli_plain.py holds both to it).
"""
from __future__ import annotations

import errno
import os
import sys
import time

from . import output
from .formats import age, byte_ranges, metadata_sizes, plain, telemetry_summary
from .protocol import GpumemError, format_size, parse_size
from .protocol.defaults import DIR_MODE, FILE_MODE
from .protocol.errors import OK


class Settings:
    """The global options (`gpumemctl --socket PATH --json COMMAND`)."""
    socket: str | None = None
    json: bool = False


def want_json(flag: bool) -> bool:
    return flag or Settings.json


def connect():
    from .client import Client
    return Client(Settings.socket)


def invoke(body, params: dict) -> int:
    """Run a command's body; returns its exit status. Its errors go through `report`."""
    try:
        code = body(**params)
        output.flush()
    except (GpumemError, OSError) as exc:
        return report(exc)
    return code or OK


def report(exc: GpumemError | OSError) -> int:
    """The one place an error becomes its line on stderr and the exit status (docs/cli.md,
    "Exit status" and "Local files"): a GpumemError is its message and code; an OSError on
    a local file (its `filename` set: every path and stdout writer sets it) the path, the
    errno's words and the errno's code; a reader that went away (`gpumemctl ls | head -1`,
    EPIPE) is not our error: exit 0, quietly. Any other OSError is a bug: its traceback."""
    if isinstance(exc, OSError):
        to_stdout = exc.filename in (None, output.STDOUT_NAME)
        if exc.errno == errno.EPIPE:
            if to_stdout:
                output.detach_stdout()
            return OK
        if exc.filename is None:
            raise exc
        from .localfiles import file_error
        if to_stdout:
            output.detach_stdout()
        exc = file_error(exc)
    output.error(str(exc))
    try:                # what the command printed before it failed, if stdout takes it
        output.flush()
    except OSError:
        output.detach_stdout()
    return exc.code


def parse_offset(text: str) -> int:
    return 0 if text in ("0", "") else parse_size(text, allow_zero=True)


# ---- namespace ----------------------------------------------------------------------------
def ls(path: str = "", long: bool = False, recursive: bool = False, json_: bool = False):
    with connect() as c:
        entries = c.ls(path, recursive=recursive)
    if want_json(json_):
        output.emit_json(entries)
    elif long:
        output.table([_ls_row(e) for e in entries],
                     ["MODE", "OWNER", "SIZE", "CAPACITY", "DEVICE", "DURABILITY", "STATE",
                      "ECC", "REFS", "LINKS", "MODIFIED", "SNAPSHOT", "NAME"],
                     right={2, 3, 8, 9})
    else:
        for e in entries:
            output.data(e["path"] + ("/" if e["type"] == "directory" else ""))


# `ls -l`'s type letter and STATE word of the nodes that are not allocations.
_LS_KINDS = {"directory": ("d", "dir"), "symlink": ("l", "link"), "fifo": ("p", "fifo"),
             "socket": ("s", "socket"), "char-device": ("c", "chardev"),
             "block-device": ("b", "blockdev")}


def _ls_row(e: dict) -> list[str]:
    name = e["path"] + ("/" if e["type"] == "directory" else "")
    if e["type"] == "symlink":
        name += f" -> {e['target']}"
    if e["type"] in _LS_KINDS:
        size = f"{e['major']},{e['minor']}" if "major" in e else "-"
        return [_mode_string(e), f"{e['uid']}:{e['gid']}", size, "-", "-", "-",
                _LS_KINDS[e["type"]][1], "-", "-", str(e["links"]), e["modified"][:19], "-",
                name]
    return [_mode_string(e), f"{e['uid']}:{e['gid']}", format_size(e["size"]),
            format_size(e["capacity"]), (e["device"] or "-")[:13],
            "durable" if e["durable"] else "transient", e["state"], e["ecc"],
            str(e["refcount"]), str(e["links"]), e["modified"][:19],
            age(e.get("snapshot_time"), time.time(), never="-"), name]


def _mode_string(e: dict) -> str:
    mode = int(e["mode"], 8)
    kind = _LS_KINDS.get(e["type"], ("-",))[0]
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    if mode & 0o1000:
        bits = bits[:8] + ("t" if mode & 1 else "T")
    return kind + bits


def create(name: str, size: str, durable: bool = False, device: str | None = None,
           mode: str = f"{FILE_MODE:04o}", ecc: str | None = None, exist_ok: bool = False,
           json_: bool = False):
    from .formats import parse_mode
    nbytes, bits = parse_size(size), parse_mode(mode)
    with connect() as c:
        info = c.create(name, nbytes, durable=durable, mode=bits, device=device, ecc=ecc,
                        exist_ok=exist_ok)
    if want_json(json_):
        output.emit_json(info)
    else:
        output.note(f"created {info['path']}: {format_size(info['size'])} (capacity "
                    f"{format_size(info['capacity'])}) on {info['device']}, "
                    f"{'durable' if info['durable'] else 'transient'}")


def mkdir(name: str, parents: bool = False, mode: str = f"{DIR_MODE:04o}", json_: bool = False):
    from .formats import parse_mode
    with connect() as c:
        info = c.mkdir(name, mode=parse_mode(mode), parents=parents)
    if want_json(json_):
        output.emit_json(info)


def _each(names: list[str], action, json_: bool) -> int:
    """Apply `action(client, name)` to each name, carrying on past errors like rm(1).
    Exit status: the first error's code, else 0."""
    code, results = OK, []
    with connect() as c:
        for name in names:
            try:
                results.append({"name": name, "ok": True, "result": action(c, name)})
            except GpumemError as exc:
                output.error(str(exc))
                results.append({"name": name, "ok": False, "error": exc.to_wire()})
                code = code or exc.code
    if want_json(json_):
        output.emit_json(results)
    return code


def rm(names: list[str], recursive: bool = False, force: bool = False, json_: bool = False):
    return _each(names, lambda c, n: c.remove(n, recursive=recursive, force=force), json_)


def durable(names: list[str], json_: bool = False):
    return _each(names, lambda c, n: c.set_durable(n, True), json_)


def transient(names: list[str], json_: bool = False):
    return _each(names, lambda c, n: c.set_durable(n, False), json_)


def info(name: str, json_: bool = False):
    with connect() as c:
        data = c.info(name)
    if want_json(json_):
        output.emit_json(data)
        return
    for key in sorted(data):
        output.data(f"{key:18} {_info_value(key, data[key])}")


def _info_value(key: str, value) -> str:
    if key == "names":
        return ", ".join(value)
    if key == "holders":
        return ", ".join(f"{h['kind']} (pid {h['pid']}, uid {h['uid']})"
                         for h in value) or "none"
    if key in ("size", "capacity") and value is not None:
        return f"{value} ({format_size(value)})"
    if key == "damaged":
        return byte_ranges(value)
    if key == "metadata":
        return metadata_sizes(value)
    return plain(value)


def revoke(name: str, json_: bool = False):
    with connect() as c:
        revoked = c.revoke(name)
    if want_json(json_):
        output.emit_json(revoked)
        return
    for h in revoked:
        output.data(f"revoked {h['kind']} by pid {h['pid']} (uid {h['uid']})")
    if not revoked:
        output.note(f"no other session reads {name}")


# ---- data -----------------------------------------------------------------------------------
def write(name: str, file: str = "-", offset: str = "0", json_: bool = False):
    from .localfiles import open_input
    start = parse_offset(offset)
    src = sys.stdin.buffer if file == "-" else open_input(file, regular_only=False)
    total = os.fstat(src.fileno()).st_size if file != "-" else None
    meter = output.Progress(f"write {name}", total or 0)
    with connect() as c:
        done = c.write_from(name, src, start, progress=meter, total=total)
    meter.finish()
    if want_json(json_):
        output.emit_json({"name": name, "offset": start, "bytes": done})


def read(name: str, file: str = "-", offset: str = "0", length: str | None = None):
    start = parse_offset(offset)
    count = None if length is None else parse_size(length, allow_zero=True)
    out = sys.stdout.buffer if file == "-" else _open_output(file)
    with connect() as c:
        total = count if count is not None else max((c.info(name).get("size") or 0) - start, 0)
        meter = output.Progress(f"read {name}", total)
        c.read_to(name, out, start, count, progress=meter)
    try:
        out.flush()
    except OSError as exc:
        if exc.filename is None:
            exc.filename = output.STDOUT_NAME if file == "-" else file
        raise
    meter.finish()


def _open_output(path: str):
    """FILE of `read`: opened for writing as `dd of=FILE` does (created, truncated; a
    device or FIFO written as it is)."""
    try:
        return open(path, "wb")
    except OSError as exc:
        from .localfiles import file_error
        raise file_error(exc, path, "write") from None


# ---- daemon ---------------------------------------------------------------------------------
def status(json_: bool = False):
    with connect() as c:
        s = c.status()
    if want_json(json_):
        output.emit_json(s)
        return
    d, k, t = s["daemon"], s["keeper"], s["totals"]
    output.data(f"daemon:   gpumemd {d['version']} pid {d['pid']}, backend {d['backend']}, "
                f"up {d['uptime_s']:.0f}s, socket {d['socket']}")
    # max_fds: systemd's fd store only (FileDescriptorStoreMax=, docs/operations.md)
    of_max = f" of {plain(k['max_fds'])}" if k.get("max_fds") is not None else ""
    keeper = f"pid {plain(k.get('pid'))}, holding {plain(k.get('held'))} allocations " \
             f"({plain(k.get('fds'))}{of_max} fds)" if k.get("alive") else \
             f"NOT RUNNING ({k.get('error') or 'no reason given'})"
    output.data(f"keeper:   {k['kind']} {keeper}")
    for dev in s["devices"]:
        output.data(f"device {dev['index']}: {dev['name']} {dev['uuid']}: "
                    f"{format_size(dev['ours'])} ours, {format_size(dev['free'])} free of "
                    f"{format_size(dev['total'])}; {telemetry_summary(dev)}")
    states = ", ".join(f"{n} {st}" for st, n in sorted(t["by_state"].items())) or "none"
    output.data(f"totals:   {t['allocations']} allocations ({states}), {t['durable']} durable, "
                f"{format_size(t['size'])} in use, {t['sessions']} sessions")
    output.data(f"scrub:    {s['scrub']['state']}")
