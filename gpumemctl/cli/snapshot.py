"""`gpumemctl snapshot create|restore|verify|ls|rm` (docs/snapshots.md): the declarations and
what each prints. The work is gpumemctl/snapshots/'s (engine.py names it), imported only when
one of them runs.

Exit codes as everywhere (docs/cli.md): 0 done; 8 a snapshot (or a restored allocation) has
damage, named; 9 an allocation was skipped because a writer held it; 4 no such store or
snapshot; 2 bad arguments; 6 permission denied (the store's or the daemon's), or a snapshot
passed over because the caller does not trust who wrote it (docs/snapshots.md, "Who may
write a store, and what a restore trusts").
"""
from __future__ import annotations

import sys
import time

from .. import output
from ..formats import byte_ranges
from ..protocol import NotRunning, format_size
from ..protocol.errors import BUSY, INVALID_STATE, OK, PERMISSION, UNCORRECTABLE
from ..protocol.escape import escape
from .context import connect, want_json
from .declare import JSON, Arg, Group, Opt

commands = Group()
snapshot = commands.group("snapshot", help="Snapshots of durable allocations to a directory "
                                           "or s3://bucket/prefix, and restores from them "
                                           "(docs/snapshots.md).", no_args_is_help=True)

QUIET = Opt("--quiet", "-q", help="No progress meter and no summary when all went well (for "
                                  "cron).")
WHERE = Arg("A directory or s3://bucket/prefix holding snapshots.")
SRC = Arg("A snapshot store (a directory or s3://bucket/prefix), or one snapshot in it: "
          "STORE/snap-...")
NAMES = Arg("Allocations or directories (everything under them); default: all.")
TRUST = Opt("--trust-uid", metavar="UID",
            help="Also trust snapshot files this uid (or user name) owns, as your own and "
                 "root's are; repeatable. For a store written under another uid (NFS "
                 "root_squash: 65534); docs/snapshots.md.")


def _trusted(values: list[str] | None) -> frozenset[int]:
    from ..snapshots.trust import parse_uids
    return parse_uids(values)


def _passed_over(result: dict) -> None:
    """One line per snapshot a command passed over: whose it is, or what is wrong with it."""
    for p in result.get("passed_over", []):
        output.error(p["message"])


def summary(line: str) -> None:
    """A command's summary for a person: stderr, whatever it is (a cron job's log keeps it;
    `--quiet` leaves it out), escaped as output's lines are. stdout carries only data: a
    listing, the JSON document (docs/cli.md)."""
    try:
        print(escape(line), file=sys.stderr)
    except OSError:         # stderr itself is gone or full: the exit status still says it
        pass


def _meter(label: str, quiet: bool) -> output.Progress:
    return output.Progress(label, 0, enabled=False if quiet else None)


def _report(**report) -> None:
    """Tell gpumemd (events, status, metrics); a daemon that is gone changes nothing here."""
    try:
        with connect() as c:
            c.snapshot_report(**report)
    except NotRunning:
        pass


@snapshot.command(
    "create", dest=WHERE, names=NAMES,
    incremental=Opt("--incremental", "-i", help="Write only the blocks changed since the "
                                                "newest snapshot in DEST; refer to it for "
                                                "the rest."),
    trust_uid=TRUST, quiet=QUIET, json_=JSON)
def create(dest: str, names: list[str] | None = None, incremental: bool = False,
           trust_uid: list[str] | None = None, quiet: bool = False, json_: bool = False):
    """Snapshot allocations into a new snapshot in DEST (default: every durable allocation
    you may read). A lost one is carried over from the newest snapshot in DEST that holds
    it; exit 9 if a writer held one, 10 if a lost one is in no snapshot there."""
    from ..snapshots import engine
    meter = _meter("snapshot", quiet)
    with connect() as c:
        backend = c.hello.get("backend", "host")
        try:
            result = engine.create(c, dest, names or [], incremental=incremental,
                                   progress=meter, backend=backend,
                                   trust_uids=_trusted(trust_uid))
        finally:
            meter.finish()
        busy = [s for s in result["skipped"] if s["reason"] == "busy"]
        lost = [s for s in result["skipped"] if s["reason"] == "lost"]
        c.snapshot_report(action="create", snapshot=result["snapshot"],
                          location=result["location"],
                          result="partial" if busy or lost else "ok",
                          bytes=result["bytes"], bytes_written=result["bytes_written"],
                          duration_ms=int(result["seconds"] * 1000),
                          allocations=len(result["allocations"]),
                          incremental=result["incremental"], io=result["io"],
                          paths=[a["path"] for a in result["allocations"]])
    for p in result["passed_over"]:
        output.warning(f"passed over: {p['message']}")
    for s in result["skipped"]:
        output.warning(f"skipped '{s['path']}': {s['message']}")
    if want_json(json_):
        output.emit_json(result)
    elif not quiet or busy or lost:
        kind = f"incremental on {result['parent']}" if result["incremental"] else "full"
        summary(f"snapshot {result['location']}: {len(result['allocations'])} "
                    f"allocation(s), {format_size(result['bytes'])} "
                    f"({format_size(result['bytes_written'])} written, {kind}) in "
                    f"{result['seconds']:.2f} s, {_rate(result)}, io {result['io']}")
    if busy:
        return BUSY
    return INVALID_STATE if lost else OK


def _rate(result: dict) -> str:
    return f"{format_size(result['rate'])}/s" if result.get("rate") else "-"


@snapshot.command(
    "restore", src=SRC, names=NAMES,
    as_=Opt("--as", help="Restore under this directory prefix instead of the saved names."),
    device=Opt("--device", help="Device index or UUID for the allocations made."),
    force=Opt("--force", help="Restore over existing allocations you may write (their data "
                              "is replaced)."),
    lost_only=Opt("--lost-only", help="Only refill allocations in state lost; create "
                                      "nothing."),
    trust_uid=TRUST, quiet=QUIET, json_=JSON)
def restore(src: str, names: list[str] | None = None, as_: str | None = None,
            device: str | None = None, force: bool = False, lost_only: bool = False,
            trust_uid: list[str] | None = None, quiet: bool = False, json_: bool = False):
    """Recreate allocations from a snapshot, or refill `lost` ones in place: from a store,
    each from the newest complete snapshot you trust that holds it. Every block is checked
    on the way in; one that fails is never served (the allocation is `degraded`, exit 8)."""
    from ..snapshots import engine
    meter = _meter("restore", quiet)
    with connect() as c:
        try:
            result = engine.restore(c, src, names or [], as_prefix=as_, device=device,
                                    force=force, lost_only=lost_only, progress=meter,
                                    trust_uids=_trusted(trust_uid))
        finally:
            meter.finish()
        failures = result.pop("_failures")
        codes = [f.code for f in failures] + [p["code"] for p in result["passed_over"]]
        outcome = "damaged" if result["damaged"] else ("failed" if codes else "ok")
        c.snapshot_report(action="restore", snapshot=result["snapshot"] or "",
                          location=result["location"], result=outcome, bytes=result["bytes"],
                          duration_ms=int(result["seconds"] * 1000),
                          allocations=len(result["allocations"]), io=result["io"])
    _passed_over(result)                # on stderr with --json too, as create's warnings
    if want_json(json_):
        output.emit_json(result)
    else:
        for r in result["allocations"]:
            if r["result"] == "degraded":
                output.warning(f"'{r['path']}' is degraded: snapshot blocks failed their "
                               f"checksum at {_ranges(r['damaged'])}; those bytes read as "
                               "EIO")
            elif r["result"] != "ok":
                output.error(_naming(r["path"], r["message"]))
        if not quiet or codes or result["damaged"]:
            summary(_restore_summary(result))
    if result["damaged"]:
        return UNCORRECTABLE
    return max(codes, default=OK)


def _naming(path: str, message: str) -> str:
    """An allocation's error, naming it once (most messages name it already)."""
    return message if f"'{path}'" in message else f"'{path}': {message}"


def _restore_summary(result: dict) -> str:
    """Only what was moved is counted: a failed allocation has no size or rate here."""
    done = sum(1 for r in result["allocations"] if r["result"] in ("ok", "degraded"))
    moved = format_size(result["bytes"])
    timing = f"{moved} in {result['seconds']:.2f} s, {_rate(result)}" if result["bytes"] \
        else "nothing moved"
    passed = f", {len(result['passed_over'])} snapshot(s) passed over" \
        if result["passed_over"] else ""
    return (f"restore {result['location']}: {done} of {len(result['allocations'])} "
            f"allocation(s) restored, {timing}: {result['damaged']} degraded, "
            f"{result['failed']} failed{passed}")


def _ranges(ranges: list) -> str:
    """First and last byte of each range, as `info` shows them (formats.byte_ranges)."""
    return byte_ranges(ranges, limit=8)


@snapshot.command("verify", src=SRC, trust_uid=TRUST, quiet=QUIET, json_=JSON)
def verify(src: str, trust_uid: list[str] | None = None, quiet: bool = False,
           json_: bool = False):
    """Check every snapshot in a store (or the one named) that you trust: manifests and
    every block. Exit 0 clean, 8 damaged (named), 6 one was not checked (not trusted)."""
    from ..snapshots import engine
    meter = _meter("verify", quiet)
    started = time.monotonic()
    try:
        result = engine.verify(src, progress=meter, trust_uids=_trusted(trust_uid))
    finally:
        meter.finish()
    bad = result["damaged"]
    _report(action="verify", location=src, result="damaged" if bad else "ok",
            bytes=sum(s.get("bytes", 0) for s in result["snapshots"]),
            duration_ms=int((time.monotonic() - started) * 1000),
            allocations=sum(s.get("allocations", 0) for s in result["snapshots"]))
    if want_json(json_):
        output.emit_json(result)
    else:
        for s in result["snapshots"]:
            for p in s["problems"]:
                output.data(f"{s['snapshot']}: DAMAGED: {p['message']}"
                            + (f" (bytes {_ranges(p['ranges'])})" if p.get("ranges") else ""))
            if s["result"] == "retired":
                output.data(f"{s['snapshot']}: retired (removed; newer snapshots use its "
                            "data)")
            elif s["result"] == "partial":
                output.data(f"{s['snapshot']}: partial (never completed; `gpumemctl "
                            "snapshot rm` removes it)")
            elif s["result"] == "untrusted":
                output.error(f"{s['snapshot']}: not checked: {s['problems'][0]['message']}")
        untrusted = f", {result['untrusted']} not trusted" if result["untrusted"] else ""
        if not quiet or bad or untrusted:
            summary(f"verify {src}: {len(result['snapshots'])} snapshot(s), {bad} "
                    f"damaged{untrusted}")
    if bad:
        return UNCORRECTABLE
    return PERMISSION if result["untrusted"] else OK


@snapshot.command("ls", src=SRC, trust_uid=TRUST, json_=JSON)
def ls(src: str, trust_uid: list[str] | None = None, json_: bool = False):
    """List the snapshots in a store: complete, untrusted (a restore passes it over),
    partial, in progress, damaged or retired, and who owns each. Given one snapshot
    (STORE/snap-...): the allocations it holds, with size, blocks and state."""
    from ..snapshots import engine
    if engine.split_location(src)[1] is not None:
        return _ls_snapshot(src, trust_uid, json_)
    rows = engine.list_snapshots(src, trust_uids=_trusted(trust_uid))
    if want_json(json_):
        output.emit_json(rows)
        return OK
    for r in rows:
        if r.get("message") or r.get("distrust"):
            output.warning(f"{r['snapshot']}: {r.get('message') or r['distrust']}")
    table = []
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["created_ns"] / 1e9)) \
            if r.get("created_ns") else "-"
        table.append([r["snapshot"], r["state"], created,
                      str(r.get("allocations", "-")),
                      format_size(r["bytes"]) if "bytes" in r else "-",
                      format_size(r["bytes_written"]) if "bytes_written" in r else "-",
                      r.get("parent") or "-",
                      "-" if r.get("owner") is None else str(r["owner"])])
    output.table(table, ["SNAPSHOT", "STATE", "CREATED (UTC)", "ALLOCS", "SIZE", "WRITTEN",
                         "PARENT", "OWNER"], right={3, 4, 5})
    return OK


def _ls_snapshot(src: str, trust_uid: list[str] | None, json_: bool) -> int:
    """`snapshot ls STORE/snap-...`: one row per allocation it holds (as `restic ls` or
    `borg list ARCHIVE`); one the caller does not trust is listed, and said so on stderr."""
    from ..snapshots import engine
    rows, distrust = engine.list_allocations(src, trust_uids=_trusted(trust_uid))
    if distrust:
        output.warning(f"not trusted (a restore passes it over): {distrust}")
    if want_json(json_):
        output.emit_json(rows)
        return OK
    output.table([[r["path"], format_size(r["size"]), str(r["blocks"]), r["state"],
                   r["modified"] or "-"] for r in rows],
                 ["PATH", "SIZE", "BLOCKS", "STATE", "MODIFIED (UTC)"], right={1, 2})
    return OK


@snapshot.command(
    "rm", src=SRC,
    keep=Opt("--keep", min=0, help="Keep the newest N complete snapshots you trust; remove "
                                   "the rest of yours and every partial one."),
    trust_uid=TRUST, json_=JSON)
def rm(src: str, keep: int | None = None, trust_uid: list[str] | None = None,
       json_: bool = False):
    """Remove one snapshot (STORE/snap-...), or all but the newest N (--keep N); others'
    snapshots are left alone. Data a kept incremental snapshot refers to stays."""
    from ..snapshots import engine
    result = engine.remove(src, keep, trust_uids=_trusted(trust_uid))
    if want_json(json_):
        output.emit_json(result)
    else:
        for name in result["removed"]:
            output.data(f"removed {name}")
        if result["left_alone"]:
            output.warning("left alone, not yours to remove: " + ", ".join(
                f"{o['snapshot']} (uid {o['owner']})" for o in result["left_alone"]))
        if result["objects_kept_for_newer"]:
            output.note(f"kept {result['objects_kept_for_newer']} data object(s) that newer "
                        "snapshots refer to")
    return OK

