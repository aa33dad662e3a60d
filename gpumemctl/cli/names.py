"""`gpumemctl ls|info|create|mkdir|rm|ln|mv|resize|durable|transient|revoke`: names, the
nodes they name and what is set on them. Most of these are the commands scripts run in
loops, declared `plain` (gpumemctl/cli/plain.py runs them without typer), so this module
imports no more than their bodies need: gpumemctl.formats (datetime, functools) only for a
person's output, never for --json."""
from __future__ import annotations

import time

from .. import output
from ..protocol import GpumemError, format_size, parse_size
from ..protocol.defaults import DIR_MODE, FILE_MODE
from ..protocol.errors import OK
from .context import CommandLineError, connect, want_json
from .declare import DEVICE, DURABLE, ECC, JSON, NAME, NAMES, NODE, Arg, Group, Opt
from .declare import FILE_MODE as MODE

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from ..protocol.replies import Node

commands = Group()


@commands.command(
    "ls", plain=True,
    path=Arg("Directory or allocation to list (default: the top).", complete=True),
    long=Opt("-l", "--long", help="Long listing."),
    recursive=Opt("-R", "--recursive", help="List directories' contents too."),
    numeric=Opt("-n", "--numeric-uid-gid",
                help="Long listing with owners as numbers (as ls -n)."),
    json_=JSON)
def ls(path: str = "", long: bool = False, recursive: bool = False, numeric: bool = False,
       json_: bool = False):
    """List allocations and directories.

    -l shows owners by name where this machine resolves them; JSON has the numbers."""
    with connect() as c:
        entries = c.ls(path, recursive=recursive)
    if want_json(json_):
        output.emit_json(entries)
    elif long or numeric:
        output.table([_ls_row(e, numeric) for e in entries],
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


def _ls_row(e: Node, numeric: bool = False) -> list[str]:
    from ..formats import age
    from ..protocol.owners import owner
    who = owner(e["uid"], e["gid"], numeric)
    name = e["path"] + ("/" if e["type"] == "directory" else "")
    if e["type"] == "symlink":
        name += f" -> {e['target']}"
    if e["type"] != "allocation":
        size = f"{e.get('major')},{e.get('minor')}" if "major" in e else "-"
        # A directory's durable default (issue 27): what is created in it is durable.
        durability = "durable" if e["type"] == "directory" and e.get("durable") else "-"
        return [_mode_string(e), who, size, "-", "-", durability,
                _LS_KINDS[e["type"]][1], "-", "-", str(e["links"]), e["modified"][:19], "-",
                name]
    return [_mode_string(e), who, format_size(e["size"]),
            format_size(e["capacity"]), (e["device"] or "-")[:13],
            "durable" if e["durable"] else "transient", e["state"], e["ecc"],
            str(e["refcount"]), str(e["links"]), e["modified"][:19],
            age(e.get("snapshot_time"), time.time(), never="-"), name]


def _mode_string(e: Node) -> str:
    mode = int(e["mode"], 8)
    kind = _LS_KINDS.get(e["type"], ("-",))[0]
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    if mode & 0o1000:
        bits = bits[:8] + ("t" if mode & 1 else "T")
    return kind + bits


@commands.command(
    "create", plain=True,
    name=Arg("Allocation name, e.g. models/llama (none with --from).", complete=True),
    size=Opt("--size", "-s", help="e.g. 4096, 64K, 1.5G, 2GB (none with --from)."),
    durable=DURABLE, device=DEVICE, mode=MODE, ecc=ECC,
    exist_ok=Opt("--exist-ok", help="Succeed if it exists with this size."),
    from_=Opt("--from", metavar="FILE",
              help="Create one allocation per line of FILE (- for stdin), each line NAME "
                   "SIZE (blank lines and # comments skipped), in one request; the other "
                   "options apply to every line. A malformed line: exit 2, nothing "
                   "created. Exit status: the first failure's code, 0 when every one was "
                   "created."),
    json_=JSON)
def create(name: str | None = None, size: str | None = None, durable: bool = False,
           device: str | None = None, mode: str = f"{FILE_MODE:04o}", ecc: str | None = None,
           exist_ok: bool = False, from_: str | None = None, json_: bool = False):
    """Allocate NAME (missing parent directories are created), or every NAME SIZE line of
    --from FILE."""
    from ..formats import parse_mode
    if from_ is not None:
        if name is not None or size is not None:
            raise CommandLineError("--from takes every name and size from its file: give "
                                   "no NAME or --size with it", "create")
        from .createfrom import create_from
        return create_from(from_, durable=durable, device=device, mode=parse_mode(mode),
                           ecc=ecc, exist_ok=exist_ok, json_=want_json(json_))
    if name is None:
        raise CommandLineError("missing argument 'NAME'", "create")
    if size is None:
        raise CommandLineError("missing option '--size' / '-s'", "create")
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


@commands.command(
    "mkdir", plain=True,
    name=Arg("Directory name, e.g. models.", complete=True),
    parents=Opt("-p", "--parents", help="Create missing parents; no error if it exists."),
    mode=Opt("--mode", help="Octal permissions."),
    json_=JSON)
def mkdir(name: str, parents: bool = False, mode: str = f"{DIR_MODE:04o}", json_: bool = False):
    """Create a directory."""
    from ..formats import parse_mode
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


@commands.command(
    "rm", plain=True,
    names=Arg("One or more allocations (directories with -r).", complete=True),
    recursive=Opt("-r", "-R", "--recursive", help="Remove directories and their contents."),
    force=Opt("-f", "--force",
              help="Remove even while held; memory goes with the last holder."),
    json_=JSON)
def rm(names: list[str], recursive: bool = False, force: bool = False, json_: bool = False):
    """Free allocations (and, with -r, directories)."""
    return _each(names, lambda c, n: c.remove(n, recursive=recursive, force=force), json_)


@commands.command(
    "ln",
    target=Arg("With -s: what the link points to, a path relative to the link's directory, "
               "or an absolute path (followed by the daemon only under its mount point). "
               "Without: an existing name (not followed)."),
    name=Arg("The link to make, e.g. models/current.", complete=True),
    symbolic=Opt("-s", "--symbolic", help="Make a symbolic link."),
    json_=JSON)
def ln(target: str, name: str, symbolic: bool = False, json_: bool = False):
    """Make NAME one more name of TARGET (a hard link), or with -s a symbolic link to it."""
    with connect() as c:
        info = c.symlink(target, name) if symbolic else c.link(target, name)
    if want_json(json_):
        output.emit_json(info)


@commands.command(
    "mv", plain=True,
    source=Arg("The allocation, directory or link to rename.", complete=True),
    dest=Arg("Its new name; an existing directory: move it into that directory.",
             complete=True),
    no_clobber=Opt("-n", "--no-clobber", help="Do not replace an existing DEST."),
    json_=JSON)
def mv(source: str, dest: str, no_clobber: bool = False, json_: bool = False):
    """Rename SOURCE to DEST, or move it into the directory DEST (as mv does).

    An existing DEST that is not a directory is replaced (its memory freed), unless -n."""
    with connect() as c:
        target = _into_directory(c, source, dest)
        info = c.rename(source, target, replace=not no_clobber)
    if want_json(json_):
        output.emit_json(info)


def _into_directory(c, source: str, dest: str) -> str:
    """DEST/basename(SOURCE) where DEST is an existing directory (mv's rule), else DEST."""
    try:
        node = c.info(dest)
    except GpumemError:
        return dest
    if node["type"] != "directory":
        return dest
    base = source.rstrip("/").rsplit("/", 1)[-1]
    return f"{dest.rstrip('/')}/{base}" if dest.strip("/") else base


@commands.command(
    "resize", plain=True, name=NAME,
    size=Opt("--size", "-s", help="The new size, e.g. 64M, 1.5G, or 0."), json_=JSON)
def resize(name: str, size: str | None = None, json_: bool = False):
    """Set NAME's size, as truncate(1): bytes past the old size read as zeros.

    No other client may hold NAME open or attached while it is resized (exit 9)."""
    if size is None:
        raise CommandLineError("missing option '--size' / '-s' (e.g. --size 8G)", "resize")
    nbytes = parse_size(size, allow_zero=True)
    with connect() as c:
        info = c.resize(name, nbytes)
    if want_json(json_):
        output.emit_json(info)
        return
    output.note(f"resized {info['path']} to {format_size(info['size'])} "
                f"({info['size']} bytes)")


@commands.command("durable", plain=True, names=NAMES, json_=JSON)
def durable(names: list[str], json_: bool = False):
    """Mark allocations durable: they survive client and daemon crashes."""
    return _each(names, lambda c, n: c.set_durable(n, True), json_)


@commands.command("transient", plain=True, names=NAMES, json_=JSON)
def transient(names: list[str], json_: bool = False):
    """Mark allocations transient: freed when the daemon stops."""
    return _each(names, lambda c, n: c.set_durable(n, False), json_)


@commands.command("info", plain=True, name=NODE, json_=JSON)
def info(name: str, json_: bool = False):
    """Everything known about one allocation or directory."""
    with connect() as c:
        data = c.info(name)
    if want_json(json_):
        output.emit_json(data)
        return
    for key, value in sorted(data.items()):
        output.data(f"{key:18} {_info_value(key, value)}")


def _holder(h) -> str:
    """`read (pid 42, uid 1000 (ann), docker 1a2b3c4d5e6f)`: its container where known."""
    from ..formats import container_name
    where = container_name(h.get("container"))
    return f"{h['kind']} (pid {h['pid']}, {_uid(h['uid'])}" + \
        (f", {where})" if where else ")")


def _info_value(key: str, value) -> str:
    from ..formats import byte_ranges, metadata_sizes, plain
    if key == "names":
        return ", ".join(value)
    if key == "holders":
        return ", ".join(_holder(h) for h in value) or "none"
    if key in ("uid", "gid") and isinstance(value, int):
        from ..protocol.owners import group_name, user_name
        name = (user_name if key == "uid" else group_name)(value)
        return f"{value} ({name})" if name else str(value)
    if key in ("size", "capacity") and value is not None:
        return f"{value} ({format_size(value)})"
    if key == "extents":       # memory of several backend allocations (docs/storage.md)
        return f"{len(value)}: " + " + ".join(format_size(n) for n in value)
    if key == "damaged":
        return byte_ranges(value)
    if key == "metadata":
        return metadata_sizes(value)
    return plain(value)


@commands.command("revoke", name=NAME, json_=JSON)
def revoke(name: str, json_: bool = False):
    """Take NAME's read locks from every other session (owner or administrator).

    For a reader that never lets go: its handles and read-only attachments stop blocking
    writes; its mapping stays and sees what is written from now on. Writers are not revoked
    (docs/security.md)."""
    with connect() as c:
        revoked = c.revoke(name)
    if want_json(json_):
        output.emit_json(revoked)
        return
    for h in revoked:
        output.data(f"revoked {h['kind']} by pid {h['pid']} (uid {h['uid']})")
    if not revoked:
        output.note(f"no other session reads {name}")


def _uid(uid: int) -> str:
    from ..protocol.owners import user_name
    name = user_name(uid)
    return f"uid {uid} ({name})" if name else f"uid {uid}"
