"""`gpumemctl check|verify|recover|scrub|compact|debug corrupt`: whether what is stored is
whole, and its repair (docs/ecc.md): the registry's consistency, allocations against their
parity now or in the background, the slabs compacted (docs/storage.md), and the fault
injection that tests and drills damage them with.

Exit status of each: 0 clean, 1 damage (or problems) found and all repaired, 8 damage left
(`check`: 10 problems remain)."""
from __future__ import annotations

from .. import formats, output
from ..protocol import InternalError, format_size, parse_size
from ..protocol.defaults import CORRUPT_PATTERN
from ..protocol.errors import INVALID_STATE, OK, REPAIRED, UNCORRECTABLE
from .context import CommandLineError, connect, parse_offset, want_json
from .declare import JSON, NAME, OFFSET, Arg, Group, Opt

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from ..protocol.replies import ScrubCounts, ScrubStatus, Verified

commands = Group()


@commands.command("check", repair=Opt("--repair", help="Fix what can be fixed."), json_=JSON)
def check(repair: bool = False, json_: bool = False):
    """Consistency check of registry, backend and keeper (like fsck).
    Exit 0 clean, 1 problems found and all repaired, 10 problems remain."""
    with connect() as c:
        result = c.check(repair=repair)
    if want_json(json_):
        output.emit_json(result)
    else:
        for p in result["problems"]:
            output.data(f"{p['check']}: {p['message']}"
                        + (" [repaired]" if p["repaired"] else ""))
        output.data("check: clean" if result["clean"] else
                    f"check: {len(result['problems'])} problem(s)")
    if result["clean"]:
        return OK
    return REPAIRED if all(p["repaired"] for p in result["problems"]) else INVALID_STATE


@commands.command("compact", dry_run=Opt("--dry-run", help="Say what would move; move nothing."),
                  json_=JSON)
def compact(dry_run: bool = False, json_: bool = False):
    """Move small allocations out of sparse slabs into fuller ones of the same owner, and
    free the slabs emptied (docs/storage.md). Root, the daemon's user or admin_group only.
    Exit 0 (also when nothing could move), 6 not permitted."""
    with connect() as c:
        result = c.compact(dry_run=dry_run)
    if want_json(json_):
        output.emit_json(result)
        return OK
    verb = "would move" if result["dry_run"] else "moved"
    for m in result["moved"]:
        to = f"slab {m['to']['slab']}" + ("" if m["to"]["slot"] is None else
                                          f" slot {m['to']['slot']}")
        output.data(f"{verb} {m['path'] or '#' + str(m['id'])}: slab {m['from']['slab']} "
                    f"slot {m['from']['slot']} -> {to}")
    if result["moved_count"] > len(result["moved"]):
        output.data(f"... and {result['moved_count'] - len(result['moved'])} more")
    for k in result["skipped"]:
        output.data(f"kept {k['path'] or '#' + str(k['id'])}: {k['reason']}")
    for f in result["slabs_freed"]:
        output.data(f"{'would free' if result['dry_run'] else 'freed'} slab {f['slab']} "
                    f"(uid {f['uid']}, {format_size(f['class'])} slots): "
                    f"{format_size(f['bytes'])} + {format_size(f['parity_bytes'])} parity")
    output.data(f"compact: {verb} {result['moved_count']} allocations "
                f"({format_size(result['moved_bytes'])}), "
                f"{len(result['slabs_freed'])} slabs, "
                f"{format_size(result['freed_bytes'])} "
                f"{'would be given back' if result['dry_run'] else 'given back'}")
    return OK


def _verify_line(r: Verified) -> str:
    if r.get("skipped_reason"):
        return f"{r['path']}: skipped ({r['skipped_reason']})"
    parts = [f"{r['blocks']} blocks", f"{r['clean']} clean"]
    if r["corrected"]:
        parts.append(f"{r['corrected']} repaired ({r['symbols']} symbols)")
    if r["damaged"]:
        why = "repair not permitted: not yours" if r.get("repair") == "not permitted" \
            else "use --repair"
        parts.append(f"{len(r['damaged'])} damaged (not repaired: {why})")
    if r["uncorrectable"]:
        parts.append(f"{r['uncorrectable']} UNCORRECTABLE")
    if r["skipped"]:
        parts.append(f"{r['skipped']} skipped (written since the last sync, or unsealed)")
    line = f"{r['path']}: " + ", ".join(parts)
    if r.get("damaged_ranges"):
        line += "; damaged bytes: " + ", ".join(f"{a}-{b - 1}" for a, b in r["damaged_ranges"])
    return line


@commands.command(
    "verify",
    names=Arg("Allocations or directories (everything under them).", complete=True),
    all_=Opt("--all", help="Every allocation you may read."),
    repair=Opt("--repair", help="Repair what ECC can."),
    quiet=Opt("--quiet", "-q", help="Print nothing when all is clean (for cron)."),
    json_=JSON)
def verify(names: list[str] | None = None, all_: bool = False, repair: bool = False,
           quiet: bool = False, json_: bool = False):
    """Check allocations against their parity (and with --repair, repair them), now.
    Exit 0 clean, 1 damage found and all repaired, 8 damage left.

    Without --repair a verify only looks: damage it finds is recorded, the allocation
    becomes degraded and its damaged ranges read as EIO (never as bytes that may be wrong)
    until `verify --repair`, `recover NAME` or the next scrub repairs them. So an operator
    can first copy or snapshot what is intact, or look at the damage, before anything is
    rewritten from parity; the scrub and --repair repair at once, as ZFS's scrub does."""
    meter = output.WorkProgress("verify")
    with connect() as c:
        try:
            result = c.verify(names or [], all=all_, repair=repair, progress=meter.callback)
        finally:
            meter.finish()
    summary = result["summary"]
    if want_json(json_):
        output.emit_json(result)
    elif not (quiet and summary["exit"] == OK):
        for r in result["allocations"]:
            if not quiet or r["corrected"] or r["uncorrectable"] or r["damaged"] or \
                    r.get("damaged_ranges"):
                output.data(_verify_line(r))
        output.data(f"verify: {summary['allocations']} allocation(s), {summary['blocks']} "
                    f"blocks: {summary['corrected']} repaired, {summary['uncorrectable']} "
                    f"uncorrectable, {summary['unrepaired']} not repaired, "
                    f"{summary['skipped']} skipped")
    if result.get("left_out"):
        output.warning(f"{result['left_out']} of the {summary['allocations']} results did not "
                       "fit in one answer and are not listed (those with damage come first; "
                       "the summary counts all): verify a directory or names for the rest")
    return summary["exit"]


@commands.command("recover", name=NAME, json_=JSON)
def recover(name: str, json_: bool = False):
    """Run the repair of a (degraded) allocation again and report what remains.
    Exit 0 nothing damaged remains, 1 repaired, 8 damage remains."""
    meter = output.WorkProgress("recover")
    with connect() as c:
        try:
            result = c.recover(name, progress=meter.callback)
        finally:
            meter.finish()
    r = result["allocation"]
    left = len(r.get("damaged_ranges", []))
    if want_json(json_):
        output.emit_json(result)
    else:
        output.data(_verify_line(r))
        output.data(f"recover: '{r['path']}' is {result['info']['state']}"
                    + (f"; {left} damaged range(s) remain" if left else ""))
    return UNCORRECTABLE if left or r["uncorrectable"] else (REPAIRED if r["corrected"] else OK)


# ---- scrub ------------------------------------------------------------------------------------
def _when(ns: int | None) -> str:
    from datetime import UTC, datetime  # here: the CLI's start-up imports no more than it needs
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _scrub_counts(t: ScrubCounts) -> str:
    return (f"{t['corrected']} block(s) repaired ({t['symbols']} symbols), "
            f"{t['uncorrectable']} uncorrectable, {t['skipped']} skipped")


def scrub_report(st: ScrubStatus) -> list[str]:
    """`scrub status` in the manner of `zpool status` / `btrfs scrub status`."""
    if st.get("running"):
        t = st["totals"]
        eta = st.get("eta_seconds")
        return [f"scrub: in progress since {_when(st['started_ns'])}",
                f"  {format_size(t['bytes'])} of {format_size(st['to_scrub'])} scrubbed "
                f"({100 * st['progress']:.1f}%) at {format_size(int(st['rate_now']))}/s, "
                f"{formats.duration(eta)} to go" + (f", rate limit {format_size(st['rate'])}/s"
                                             if st.get("rate") else ""),
                f"  {_scrub_counts(t)}"]
    last = st.get("last")
    if not last:
        return ["scrub: none has run yet"]
    t = last["totals"]
    how = "stopped" if last["stopped"] else "finished"
    speed = last.get("rate")
    rate = f" at {format_size(int(speed))}/s" if speed else ""
    lines = [f"scrub: {how} {_when(last['finished_ns'])} after "
             f"{formats.duration(last['seconds'])}: {format_size(t['bytes'])} scrubbed{rate}",
             f"  {_scrub_counts(t)}"]
    if last.get("error"):
        lines.insert(1, f"  failed: {last['error']}")
    for alloc in last.get("allocations", {}).values():
        if alloc["corrected"] or alloc["uncorrectable"]:
            lines.append(f"  {alloc['path']}: {_scrub_counts(alloc)}")
    return lines


def scrub_exit(st: ScrubStatus) -> int:
    last = st.get("last") or None
    if last is not None and last.get("error"):
        return InternalError.code       # it did not finish: nothing is known clean
    t = (last.get("totals") if last is not None else None) or None
    if t is None:
        return OK
    return UNCORRECTABLE if t.get("uncorrectable") else (REPAIRED if t.get("corrected")
                                                          else OK)


scrub_commands = commands.group(
    "scrub", help="Verify and repair everything in the background (docs/ecc.md).",
    invoke_without_command=True)


def _scrub_call(action: str, **kw):
    with connect() as c:
        return c.scrub(action, **kw)


WAIT = Opt("--wait", help="Block until the scrub ends; exit 0 clean, 1 repaired, 8 damage "
                          "left.")
RATE = Opt("--rate", help="At most this many bytes/s (e.g. 2G); default: 10% of the time, "
                          "leaving 90% of the bandwidth to users.")
QUIET = Opt("--quiet", "-q", help="With --wait: print nothing when all is clean.")


@scrub_commands.bare(wait=WAIT, rate=RATE, quiet=QUIET, json_=JSON)
def scrub(wait: bool = False, rate: str | None = None, quiet: bool = False,
           json_: bool = False):
    """Start a scrub (`gpumemctl scrub` or `scrub start`), or: scrub status, scrub stop."""
    return scrub_start(wait, rate, quiet, json_)


@scrub_commands.command("start", wait=WAIT, rate=RATE, quiet=QUIET, json_=JSON)
def scrub_start(wait: bool = False, rate: str | None = None, quiet: bool = False,
                json_: bool = False):
    """Start a background scrub of every protected block (the same as `gpumemctl scrub`)."""
    limit = parse_size(rate) if rate else None
    st = _scrub_call("start", rate=limit)
    if not wait:
        if want_json(json_):
            output.emit_json(st)
        else:
            output.data(f"scrub: started, {format_size(st['to_scrub'])} to scrub "
                        "(`gpumemctl scrub status` follows it)")
        return OK
    import time
    while st.get("running"):
        time.sleep(0.2)
        st = _scrub_call("status")
    code = scrub_exit(st)
    if want_json(json_):
        output.emit_json(st)
    elif not (quiet and code == OK):
        for line in scrub_report(st):
            output.data(line)
    return code


@scrub_commands.command("status", json_=JSON)
def scrub_status(json_: bool = False):
    """Progress, rate and ETA of a running scrub; the last result otherwise."""
    st = _scrub_call("status")
    if want_json(json_):
        output.emit_json(st)
    else:
        for line in scrub_report(st):
            output.data(line)


@scrub_commands.command("stop", json_=JSON)
def scrub_stop(json_: bool = False):
    """Stop the running scrub (its counters so far become the last result)."""
    st = _scrub_call("stop")
    if want_json(json_):
        output.emit_json(st)
    else:
        output.data("scrub: stopping")


# ---- fault injection --------------------------------------------------------------------------
debug = commands.group("debug", help="Fault injection for tests and drills (gpumemd "
                                     "--enable-fault-injection).", no_args_is_help=True)


@debug.command(
    "corrupt", name=NAME, offset=OFFSET,
    length=Opt("--length", help="Bytes to change."),
    parity=Opt("--parity", help="Change the parity region instead of the data."),
    pattern=Opt("--pattern", help="Hex bytes written, repeated (default ff)."),
    json_=JSON)
def debug_corrupt(name: str, offset: str = "0", length: str = "1", parity: bool = False,
                  pattern: str = CORRUPT_PATTERN, json_: bool = False):
    """Overwrite bytes without updating the parity (refused unless gpumemd runs with
    --enable-fault-injection; root or the daemon's user only)."""
    with connect() as c:
        result = c.debug_corrupt(name, offset=parse_offset(offset),
                                 length=parse_offset(length), parity=parity, pattern=pattern)
    if want_json(json_):
        output.emit_json(result)
    else:
        output.data(f"corrupted {result['length']} byte(s) of '{result['path']}' at "
                    f"{result['offset']}" + (" (parity region)" if parity else ""))


@debug.command(
    "gpu-event",
    device=Opt("--device", help="The device's index (`gpumemctl devices`; the host backend's "
                                "is 0)."),
    xid=Opt("--xid", help="An XID error with this code (79: the GPU fell off the bus; "
                          "48, 63, 64, 74, 92-95 critical; others only recorded)."),
    ecc=Opt("--ecc", help="An ECC error: double (a double-bit, uncorrectable error)."),
    remap=Opt("--remap", help="A row remap (page retirement) pending."),
    json_=JSON)
def debug_gpu_event(device: str = "0", xid: str | None = None, ecc: str | None = None,
                    remap: bool = False, json_: bool = False):
    """Inject a GPU health event, as if NVML reported it: the device's health, a gpu_health
    event, a verify of its allocations, or (XID 79) its allocations lost (refused unless
    gpumemd runs with --enable-fault-injection; root or the daemon's user only)."""
    with connect() as c:
        result = c.debug_gpu_event(_number(device, "--device"),
                                   xid=None if xid is None else _number(xid, "--xid"),
                                   ecc=ecc, remap=remap)
    if want_json(json_):
        output.emit_json(result)
        return
    what = f"xid {result['xid']}" if result["xid"] is not None else result["cause"]
    done = f"{result['lost']} marked lost" if result["lost"] else \
        f"{result['verifying']} being verified"
    output.data(f"device {result['index']}: {what}: health {result['state']}; "
                f"{result['allocations']} allocation(s) on it, {done}")


def _number(text: str, option: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise CommandLineError(f"invalid {option} {text!r}: a number",
                               "debug gpu-event") from None
