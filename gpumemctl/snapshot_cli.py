"""`gpumemctl snapshot create|restore|verify|ls|rm` (docs/snapshots.md): the declarations and
what each prints. The work is gpumemctl/snapshots/engine.py's.

Exit codes as everywhere (docs/cli.md): 0 done; 8 a snapshot (or a restored allocation) has
damage, named; 9 an allocation was skipped because a writer held it; 4 no such store or
snapshot; 2 bad arguments; 6 permission denied (the store's or the daemon's).
"""
from __future__ import annotations

import time
from typing import Annotated

import typer

from . import output
from .actions import connect, want_json
from .protocol import GpumemError, NotRunning, format_size
from .protocol.errors import BUSY, INVALID_STATE, OK, UNCORRECTABLE
from .subapp import run_body

snapshot_app = typer.Typer(help="Snapshots of durable allocations to a directory or "
                                "s3://bucket/prefix, and restores from them "
                                "(docs/snapshots.md).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (for scripts).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress meter and no "
                                        "summary when all went well (for cron).")]
WhereArg = Annotated[str, typer.Argument(help="A directory or s3://bucket/prefix holding "
                                              "snapshots.")]
SrcArg = Annotated[str, typer.Argument(help="A snapshot store (its newest complete "
                                            "snapshot), or one snapshot in it: "
                                            "STORE/snap-...")]
NamesArg = Annotated[list[str] | None, typer.Argument(
    help="Allocations or directories (everything under them); default: all.")]


def _meter(label: str, quiet: bool) -> output.Progress:
    return output.Progress(label, 0, enabled=False if quiet else None)


def _report(**report) -> None:
    """Tell gpumemd (events, status, metrics); a daemon that is gone changes nothing here."""
    try:
        with connect() as c:
            c.snapshot_report(**report)
    except NotRunning:
        pass


@snapshot_app.command("create")
@run_body
def create(dest: WhereArg, names: NamesArg = None,
           incremental: Annotated[bool, typer.Option(
               "--incremental", "-i", help="Write only the blocks changed since the newest "
                                           "snapshot in DEST; refer to it for the rest.")]
           = False,
           quiet: QuietOpt = False, json_: JsonOpt = False):
    """Snapshot allocations into a new snapshot in DEST (default: every durable allocation
    you may read). A lost one is carried over from the newest snapshot in DEST that holds
    it; exit 9 if a writer held one, 10 if a lost one is in no snapshot there."""
    from .snapshots import engine
    meter = _meter("snapshot", quiet)
    with connect() as c:
        backend = c.hello.get("backend", "host")
        try:
            result = engine.create(c, dest, names or [], incremental=incremental,
                                   progress=meter, backend=backend)
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
    for s in result["skipped"]:
        output.warning(f"skipped '{s['path']}': {s['message']}")
    if want_json(json_):
        output.emit_json(result)
    elif not quiet or busy or lost:
        kind = f"incremental on {result['parent']}" if result["incremental"] else "full"
        output.data(f"snapshot {result['location']}: {len(result['allocations'])} "
                    f"allocation(s), {format_size(result['bytes'])} "
                    f"({format_size(result['bytes_written'])} written, {kind}) in "
                    f"{result['seconds']:.2f} s, {_rate(result)}, io {result['io']}")
    if busy:
        return BUSY
    return INVALID_STATE if lost else OK


def _rate(result: dict) -> str:
    return f"{format_size(result['rate'])}/s" if result.get("rate") else "-"


@snapshot_app.command("restore")
@run_body
def restore(src: SrcArg, names: NamesArg = None,
            as_: Annotated[str | None, typer.Option(
                "--as", help="Restore under this directory prefix instead of the saved "
                             "names.")] = None,
            device: Annotated[str | None, typer.Option(
                "--device", help="Device index or UUID for the allocations made.")] = None,
            force: Annotated[bool, typer.Option(
                "--force", help="Restore over existing allocations you may write (their "
                                "data is replaced).")] = False,
            lost_only: Annotated[bool, typer.Option(
                "--lost-only", help="Only refill allocations in state lost; create "
                                    "nothing.")] = False,
            quiet: QuietOpt = False, json_: JsonOpt = False):
    """Recreate allocations from a snapshot, or refill `lost` ones in place. Every block is
    checked on the way in; one that fails is never served (the allocation is `degraded`,
    exit 8)."""
    from .snapshots import engine
    meter = _meter("restore", quiet)
    with connect() as c:
        try:
            result = engine.restore(c, src, names or [], as_prefix=as_, device=device,
                                    force=force, lost_only=lost_only, progress=meter)
        finally:
            meter.finish()
        failures = result.pop("_failures")
        outcome = "damaged" if result["damaged"] else ("failed" if failures else "ok")
        c.snapshot_report(action="restore", snapshot=result["snapshot"],
                          location=result["location"], result=outcome, bytes=result["bytes"],
                          duration_ms=int(result["seconds"] * 1000),
                          allocations=len(result["allocations"]), io=result["io"])
    if want_json(json_):
        output.emit_json(result)
    else:
        for r in result["allocations"]:
            if r["result"] == "degraded":
                output.warning(f"'{r['path']}' is degraded: snapshot blocks failed their "
                               f"checksum at {_ranges(r['damaged'])}; those bytes read as "
                               "EIO")
            elif r["result"] != "ok":
                output.error(f"'{r['path']}': {r['message']}")
        if not quiet or failures or result["damaged"]:
            output.data(f"restore {result['location']}: {len(result['allocations'])} "
                        f"allocation(s), {format_size(result['bytes'])} in "
                        f"{result['seconds']:.2f} s, {_rate(result)}: "
                        f"{result['damaged']} degraded, {result['failed']} failed")
    if result["damaged"]:
        return UNCORRECTABLE
    return max((f.code for f in failures), default=OK)


def _ranges(ranges: list) -> str:
    return ", ".join(f"{a}-{b}" for a, b in ranges[:8]) + (" ..." if len(ranges) > 8 else "")


@snapshot_app.command("verify")
@run_body
def verify(src: SrcArg, quiet: QuietOpt = False, json_: JsonOpt = False):
    """Check every snapshot in a store (or the one named): manifests and every block.
    Exit 0 clean, 8 damaged (named)."""
    from .snapshots import engine
    meter = _meter("verify", quiet)
    started = time.monotonic()
    try:
        result = engine.verify(src, progress=meter)
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
        if not quiet or bad:
            output.data(f"verify {src}: {len(result['snapshots'])} snapshot(s), {bad} "
                        "damaged")
    return UNCORRECTABLE if bad else OK


@snapshot_app.command("ls")
@run_body
def ls(src: WhereArg, json_: JsonOpt = False):
    """List the snapshots in a store: complete, partial or damaged."""
    from .snapshots import engine
    rows = engine.list_snapshots(src)
    if want_json(json_):
        output.emit_json(rows)
        return OK
    table = []
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["created_ns"] / 1e9)) \
            if r.get("created_ns") else "-"
        table.append([r["snapshot"], r["state"], created,
                      str(r.get("allocations", "-")),
                      format_size(r["bytes"]) if "bytes" in r else "-",
                      format_size(r["bytes_written"]) if "bytes_written" in r else "-",
                      r.get("parent") or "-"])
    output.table(table, ["SNAPSHOT", "STATE", "CREATED (UTC)", "ALLOCS", "SIZE", "WRITTEN",
                         "PARENT"], right={3, 4, 5})
    return OK


@snapshot_app.command("rm")
@run_body
def rm(src: SrcArg,
       keep: Annotated[int | None, typer.Option(
           "--keep", min=0, help="Keep the newest N complete snapshots; remove the rest and "
                                 "every partial one.")] = None,
       json_: JsonOpt = False):
    """Remove one snapshot (STORE/snap-...), or all but the newest N (--keep N). Data a kept
    incremental snapshot refers to stays."""
    from .snapshots import engine
    result = engine.remove(src, keep)
    if want_json(json_):
        output.emit_json(result)
    else:
        for name in result["removed"]:
            output.data(f"removed {name}")
        if result["objects_kept_for_newer"]:
            output.note(f"kept {result['objects_kept_for_newer']} data object(s) that newer "
                        "snapshots refer to")
    return OK


__all__ = ["GpumemError", "snapshot_app"]
