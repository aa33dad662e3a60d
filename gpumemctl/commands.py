"""The `gpumemctl` command line as typer declares it: every command, option and help text.

Pinned surface and exit codes: docs/cli.md. Every command takes `--json` (or the global
one); with it, stdout is one JSON document. Errors are one line on stderr and the exit
status is the error's protocol code; a usage error is that line and `Try 'gpumemctl
COMMAND -h' for help.` (`run()` below words them, not typer's rich panel).

The commands scripts run in loops (ls, info, status, create, mkdir, rm, durable, transient,
write, read) are declared here and run from gpumemctl/actions.py, so that their plain
invocations can skip this module, typer and click altogether (gpumemctl/fastargs.py).
Completions and man pages are generated from the click tree `build_command()` returns.
This module must not import textual, cuda or pynvml at module scope (a test checks).
"""
from __future__ import annotations

import functools
import sys
from typing import Annotated

import click
import typer

from . import actions, formats, output, weights_cli
from .actions import connect, parse_offset, want_json
from .meta_cli import meta_app
from .protocol import GpumemError, InternalError, InvalidState, UsageError, format_size, parse_size
from .protocol.defaults import CORRUPT_PATTERN, DIR_MODE, EVENTS_LIMIT, FILE_MODE
from .protocol.errors import INVALID_STATE, OK, REPAIRED, UNCORRECTABLE, USAGE
from .snapshot_cli import snapshot_app
from .subapp import run_body

PROG = "gpumemctl"
# suggest_commands=False: click suggests a near command name itself; typer's own suggestion
# came on top of it ("Did you mean 'ls'? Did you mean 'ls'?").
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  suggest_commands=False,
                  help="Inspect and manage durable GPU memory served by gpumemd.",
                  context_settings={"help_option_names": ["-h", "--help"]})


# ---- shared option types (defined once, used by every command) ---------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (for scripts).")]


def complete_name(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """TAB on an allocation name: ask the daemon (gpumemctl/completion.py)."""
    from .completion import allocation_names
    return allocation_names(ctx.find_root().params.get("socket"), incomplete)


NameArg = Annotated[str, typer.Argument(help="Allocation name, e.g. models/llama.",
                                        autocompletion=complete_name)]
NodeArg = Annotated[str, typer.Argument(help="Allocation or directory name, e.g. models.",
                                        autocompletion=complete_name)]
NamesArg = Annotated[list[str], typer.Argument(help="One or more allocation names.",
                                               autocompletion=complete_name)]
OffsetOpt = Annotated[str, typer.Option("--offset", help="Byte offset (sizes like 4K work).")]
# What create and load both take for the allocations they make.
DurableOpt = Annotated[bool, typer.Option("--durable", help="Survive daemon restarts.")]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="Device index or UUID.")]
FileModeOpt = Annotated[str, typer.Option("--mode", help="Octal permissions.")]
EccOpt = Annotated[str | None, typer.Option(
    "--ecc", help="rs or none (default: the daemon's, rs unless configured).")]


def show_version(given: bool) -> None:
    """`gpumemctl --version` (eager: before any command is looked for): the distribution's
    one version, worded as `gpumemd --version` words its own."""
    if given:
        from . import __version__
        try:
            output.data(f"{PROG} {__version__}")
            output.flush()
        except OSError as exc:      # here, not in click (which exits 1 on EPIPE)
            raise typer.Exit(actions.report(exc)) from None
        raise typer.Exit(OK)


@app.callback()
def main_options(
    socket: Annotated[str | None, typer.Option(
        "--socket", envvar="GPUMEMD_SOCKET", help="gpumemd's socket.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="JSON output for every command.")]
    = False,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=show_version,
        help="Print gpumemctl's version and exit.")] = False,
) -> None:
    actions.Settings.socket = socket
    actions.Settings.json = json_


def command(*names, body=None, **kwargs):
    """Register a command. It runs `body` (gpumemctl/actions.py) with the parameters typer
    read, or, without one, the declared function itself; either way through
    actions.invoke, so a GpumemError is one stderr line and its exit code."""
    def wrap(func):
        target = body or func

        @functools.wraps(func)
        def run(**params):
            raise typer.Exit(actions.invoke(target, params))
        # What the fast path must call too (tests/unit/test_cli_plain.py reads it).
        run.body = target  # type: ignore[attr-defined]  # a function attribute
        app.command(*names, **kwargs)(run)
        return func
    return wrap


# ---- the commands run from actions.py: declarations only ----------------------------------
@command("ls", body=actions.ls)
def ls(path: Annotated[str, typer.Argument(
           help="Directory or allocation to list (default: the top).",
           autocompletion=complete_name)] = "",
       long: Annotated[bool, typer.Option("-l", "--long", help="Long listing.")] = False,
       recursive: Annotated[bool, typer.Option("-R", "--recursive",
                                               help="List directories' contents too.")]
       = False,
       json_: JsonOpt = False):
    """List allocations and directories."""


@command("create", body=actions.create)
def create(name: NameArg,
           size: Annotated[str, typer.Option("--size", "-s", help="e.g. 4096, 64K, 1.5G, 2GB.")],
           durable: DurableOpt = False, device: DeviceOpt = None,
           mode: FileModeOpt = f"{FILE_MODE:04o}", ecc: EccOpt = None,
           exist_ok: Annotated[bool, typer.Option(
               "--exist-ok", help="Succeed if it exists with this size.")] = False,
           json_: JsonOpt = False):
    """Allocate NAME (missing parent directories are created)."""


@command("mkdir", body=actions.mkdir)
def mkdir(name: Annotated[str, typer.Argument(help="Directory name, e.g. models.",
                                              autocompletion=complete_name)],
          parents: Annotated[bool, typer.Option(
              "-p", "--parents", help="Create missing parents; no error if it exists.")]
          = False,
          mode: Annotated[str, typer.Option("--mode", help="Octal permissions.")]
          = f"{DIR_MODE:04o}",
          json_: JsonOpt = False):
    """Create a directory."""


@command("rm", body=actions.rm)
def rm(names: Annotated[list[str], typer.Argument(
           help="One or more allocations (directories with -r).",
           autocompletion=complete_name)],
       recursive: Annotated[bool, typer.Option("-r", "-R", "--recursive",
                                               help="Remove directories and their contents.")]
       = False,
       force: Annotated[bool, typer.Option(
           "-f", "--force", help="Remove even while held; memory goes with the last holder.")]
       = False,
       json_: JsonOpt = False):
    """Free allocations (and, with -r, directories)."""


@command("ln")
def ln(target: Annotated[str, typer.Argument(
           help="With -s: what the link points to, a path relative to the link's "
                "directory, or an absolute path (followed by the daemon only under its "
                "mount point). Without: an existing name (not followed).")],
       name: Annotated[str, typer.Argument(help="The link to make, e.g. models/current.",
                                           autocompletion=complete_name)],
       symbolic: Annotated[bool, typer.Option("-s", "--symbolic",
                                              help="Make a symbolic link.")] = False,
       json_: JsonOpt = False):
    """Make NAME one more name of TARGET (a hard link), or with -s a symbolic link to it."""
    with connect() as c:
        info = c.symlink(target, name) if symbolic else c.link(target, name)
    if want_json(json_):
        output.emit_json(info)


@command("durable", body=actions.durable)
def durable(names: NamesArg, json_: JsonOpt = False):
    """Mark allocations durable: they survive client and daemon crashes."""


@command("transient", body=actions.transient)
def transient(names: NamesArg, json_: JsonOpt = False):
    """Mark allocations transient: freed when the daemon stops."""


@command("info", body=actions.info)
def info(name: NodeArg, json_: JsonOpt = False):
    """Everything known about one allocation or directory."""


@command("revoke", body=actions.revoke)
def revoke(name: NameArg, json_: JsonOpt = False):
    """Take NAME's read locks from every other session (owner or administrator).

    For a reader that never lets go: its handles and read-only attachments stop blocking
    writes; its mapping stays and sees what is written from now on. Writers are not revoked
    (docs/security.md)."""


@command("write", body=actions.write)
def write(name: NameArg,
          file: Annotated[str, typer.Argument(help="Input file, or - for stdin.")] = "-",
          offset: OffsetOpt = "0", json_: JsonOpt = False):
    """Write FILE (or stdin) into NAME at --offset."""


@command("read", body=actions.read)
def read(name: NameArg,
         file: Annotated[str, typer.Argument(help="Output file, or - for stdout.")] = "-",
         offset: OffsetOpt = "0",
         length: Annotated[str | None, typer.Option("--length",
                                                       help="Bytes to read.")] = None):
    """Read NAME (from --offset, --length bytes) to FILE or stdout."""


@command("status", body=actions.status)
def status(json_: JsonOpt = False):
    """Daemon, keeper, devices, totals and scrub state."""


# ---- model weights (docs/tensors.md) --------------------------------------------------------
@command("load", body=weights_cli.load)
def load(src: Annotated[str, typer.Argument(
             help="A .safetensors file, a sharded model's *.safetensors.index.json, or a "
                  "directory of .safetensors files.")],
         name: Annotated[str, typer.Argument(
             help="The allocation to make (a directory of allocations for a sharded "
                  "model), e.g. models/llama.", autocompletion=complete_name)],
         durable: DurableOpt = False, device: DeviceOpt = None,
         mode: FileModeOpt = f"{FILE_MODE:04o}", ecc: EccOpt = None,
         json_: JsonOpt = False):
    """Load safetensors weights into NAME: tensor bytes at their offsets, the header kept as
    NAME's metadata (gpumemctl.tensors.load makes zero-copy tensors of them)."""


@command("save", body=weights_cli.save)
def save(name: Annotated[str, typer.Argument(
             help="An allocation made by load (or a directory of them).",
             autocompletion=complete_name)],
         out: Annotated[str, typer.Argument(
             help="The .safetensors file to write, or - for stdout (a directory for a "
                  "sharded model).")],
         json_: JsonOpt = False):
    """Write NAME back as a safetensors file, byte-identical to its source if unchanged."""


# ---- the other commands ---------------------------------------------------------------------
@command("metrics")
def metrics(json_: JsonOpt = False):
    """Prometheus text format for node_exporter's textfile collector (docs/metrics.md).

    Built from one `status` request. When gpumemd is not running it prints `gpumemd_up 0`
    and exits 3, so that the collector shows the daemon down rather than stale numbers."""
    from . import metrics as prom
    from .protocol import NotRunning
    try:
        with connect() as c:
            families = prom.collect(c.status())
        code = OK
    except NotRunning as exc:
        output.error(str(exc))
        families, code = [prom.up_family(False)], exc.code
    if want_json(json_):
        output.emit_json([f.to_dict() for f in families])
    else:
        output.write(prom.render(families))
    return code


@command("devices")
def devices(json_: JsonOpt = False):
    """Devices of the daemon's backend with NVML telemetry (n/a: NVML cannot say).

    UNCORR: uncorrected ECC errors, volatile/aggregate. REMAP: remapped rows pending/failure.

    --json prints every field (docs/telemetry.md)."""
    with connect() as c:
        devs = c.devices()
    if want_json(json_):
        output.emit_json(devs)
        return
    output.table([[str(d["index"]), d["name"], d["uuid"][:12], formats.memory_use(d),
                   format_size(d["ours"]), formats.na(d.get("utilization_gpu"), "{}%"),
                   formats.na(d.get("temperature_c"), "{}C"), formats.power(d),
                   formats.ecc_mode(d), formats.uncorrected(d), formats.remapped(d),
                   formats.pcie(d)] for d in devs],
                 ["INDEX", "NAME", "UUID", "MEMORY", "OURS", "UTIL", "TEMP", "POWER", "ECC",
                  "UNCORR", "REMAP", "PCIE"], right={3, 4, 5, 6, 7})
    for d in devs:
        if d.get("telemetry") != "nvml":
            output.note(f"device {d['index']}: telemetry {d.get('telemetry') or 'unavailable'}")


@command("events")
def events(follow: Annotated[bool, typer.Option("-f", "--follow",
                                                help="Keep printing new events.")] = False,
           since: Annotated[int, typer.Option("--since", help="Only events after this id.")]
           = 0,
           limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many.")]
           = EVENTS_LIMIT,
           path: Annotated[str | None, typer.Option("--path",
                                                       help="Only this path (and below).")]
           = None,
           json_: JsonOpt = False):
    """The event log. With --json --follow, one JSON object per line."""
    as_json = want_json(json_)
    with connect() as c:
        if follow:
            try:
                for e in c.follow_events(since=since, limit=limit):
                    if path and e["path"] != path and not (e["path"] or "").startswith(
                            path + "/"):
                        continue
                    if as_json:
                        output.json_line(e)
                    else:
                        output.data(formats.event_line(e))
                    output.flush()
            except KeyboardInterrupt:
                return OK
        evs, complete = c.events_page(since=since, limit=limit, path=path)
    if not complete:
        output.warning("older events were left out: one answer carries at most 4 MiB of "
                    "events, the newest; ask for fewer (--limit) or later ones (--since)")
    if as_json:
        output.emit_json(evs)
    else:
        for e in evs:
            output.data(formats.event_line(e))


@command("check")
def check(repair: Annotated[bool, typer.Option("--repair", help="Fix what can be fixed.")]
          = False,
          json_: JsonOpt = False):
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


def _verify_line(r: dict) -> str:
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


@command("verify")
def verify(names: Annotated[list[str] | None, typer.Argument(
               help="Allocations or directories (everything under them).",
               autocompletion=complete_name)] = None,
           all_: Annotated[bool, typer.Option("--all", help="Every allocation you may read.")]
           = False,
           repair: Annotated[bool, typer.Option("--repair", help="Repair what ECC can.")]
           = False,
           quiet: Annotated[bool, typer.Option("--quiet", "-q",
                                               help="Print nothing when all is clean "
                                                    "(for cron).")] = False,
           json_: JsonOpt = False):
    """Check allocations against their parity (and with --repair, repair them), now.
    Exit 0 clean, 1 damage found and all repaired, 8 damage left."""
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


@command("recover")
def recover(name: NameArg, json_: JsonOpt = False):
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


def _when(ns: int | None) -> str:
    from datetime import UTC, datetime  # here: the CLI's start-up imports no more than it needs
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _scrub_counts(t: dict) -> str:
    return (f"{t['corrected']} block(s) repaired ({t['symbols']} symbols), "
            f"{t['uncorrectable']} uncorrectable, {t['skipped']} skipped")


def scrub_report(st: dict) -> list[str]:
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
    rate = f" at {format_size(int(last['rate']))}/s" if last.get("rate") else ""
    lines = [f"scrub: {how} {_when(last['finished_ns'])} after "
             f"{formats.duration(last['seconds'])}: {format_size(t['bytes'])} scrubbed{rate}",
             f"  {_scrub_counts(t)}"]
    if last.get("error"):
        lines.insert(1, f"  failed: {last['error']}")
    for alloc in last.get("allocations", {}).values():
        if alloc["corrected"] or alloc["uncorrectable"]:
            lines.append(f"  {alloc['path']}: {_scrub_counts(alloc)}")
    return lines


def scrub_exit(st: dict) -> int:
    if (st.get("last") or {}).get("error"):
        return InternalError.code       # it did not finish: nothing is known clean
    t = (st.get("last") or {}).get("totals") or {}
    return UNCORRECTABLE if t.get("uncorrectable") else (REPAIRED if t.get("corrected")
                                                          else OK)


scrub_app = typer.Typer(help="Verify and repair everything in the background "
                             "(docs/ecc.md).", invoke_without_command=True)
app.add_typer(scrub_app, name="scrub")


def _scrub_call(action: str, **kw) -> dict:
    try:
        with connect() as c:
            return c.scrub(action, **kw)
    except GpumemError as exc:
        output.error(str(exc))
        raise typer.Exit(exc.code) from None


WaitOpt = Annotated[bool, typer.Option("--wait", help="Block until the scrub ends; exit 0 "
                                        "clean, 1 repaired, 8 damage left.")]
RateOpt = Annotated[str | None, typer.Option(
    "--rate", help="At most this many bytes/s (e.g. 2G); default: 10% of the time, leaving "
                   "90% of the bandwidth to users.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="With --wait: print nothing "
                                        "when all is clean.")]


@scrub_app.callback()
def scrub(ctx: typer.Context, wait: WaitOpt = False, rate: RateOpt = None,
          quiet: QuietOpt = False, json_: JsonOpt = False):
    """Start a scrub (`gpumemctl scrub` or `scrub start`), or: scrub status, scrub stop."""
    if ctx.invoked_subcommand is None:
        raise typer.Exit(actions.invoke(_scrub_start, {"wait": wait, "rate": rate,
                                                       "quiet": quiet, "json_": json_}))


@scrub_app.command("start")
@run_body
def scrub_start(wait: WaitOpt = False, rate: RateOpt = None, quiet: QuietOpt = False,
                json_: JsonOpt = False):
    """Start a background scrub of every protected block (the same as `gpumemctl scrub`)."""
    _scrub_start(wait, rate, quiet, json_)


def _scrub_start(wait: bool, rate: str | None, quiet: bool, json_: bool) -> None:
    try:
        limit = parse_size(rate) if rate else None
    except GpumemError as exc:
        output.error(str(exc))
        raise typer.Exit(exc.code) from None
    st = _scrub_call("start", rate=limit)
    if not wait:
        if want_json(json_):
            output.emit_json(st)
        else:
            output.data(f"scrub: started, {format_size(st['to_scrub'])} to scrub "
                        "(`gpumemctl scrub status` follows it)")
        raise typer.Exit(OK)
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
    raise typer.Exit(code)


@scrub_app.command("status")
@run_body
def scrub_status(json_: JsonOpt = False):
    """Progress, rate and ETA of a running scrub; the last result otherwise."""
    st = _scrub_call("status")
    if want_json(json_):
        output.emit_json(st)
    else:
        for line in scrub_report(st):
            output.data(line)


@scrub_app.command("stop")
@run_body
def scrub_stop(json_: JsonOpt = False):
    """Stop the running scrub (its counters so far become the last result)."""
    st = _scrub_call("stop")
    if want_json(json_):
        output.emit_json(st)
    else:
        output.data("scrub: stopping")


app.add_typer(snapshot_app, name="snapshot")
app.add_typer(meta_app, name="meta")


debug_app = typer.Typer(help="Fault injection for tests and drills (gpumemd "
                             "--enable-fault-injection).", no_args_is_help=True)
app.add_typer(debug_app, name="debug")


@debug_app.command("corrupt")
@run_body
def debug_corrupt(name: NameArg,
                  offset: OffsetOpt = "0",
                  length: Annotated[str, typer.Option("--length", help="Bytes to change.")]
                  = "1",
                  parity: Annotated[bool, typer.Option(
                      "--parity", help="Change the parity region instead of the data.")]
                  = False,
                  pattern: Annotated[str, typer.Option(
                      "--pattern", help="Hex bytes written, repeated (default ff).")]
                  = CORRUPT_PATTERN,
                  json_: JsonOpt = False):
    """Overwrite bytes without updating the parity (refused unless gpumemd runs with
    --enable-fault-injection; root or the daemon's user only)."""
    try:
        with connect() as c:
            result = c.debug_corrupt(name, offset=parse_offset(offset),
                                     length=parse_offset(length), parity=parity,
                                     pattern=pattern)
    except GpumemError as exc:
        output.error(str(exc))
        raise typer.Exit(exc.code) from None
    if want_json(json_):
        output.emit_json(result)
    else:
        output.data(f"corrupted {result['length']} byte(s) of '{result['path']}' at "
                    f"{result['offset']}" + (" (parity region)" if parity else ""))


@command("top")
def top(refresh: Annotated[float, typer.Option(
            "--refresh", help="Seconds between snapshots (0.2-60); changes show at once.")]
        = 1.0,
        json_: JsonOpt = False):
    """The live monitor (TUI): devices, allocations, scrub, events; actions by key."""
    if want_json(json_):
        raise UsageError("top is interactive; for scripts use `gpumemctl status --json` and "
                         "`gpumemctl ls -R --json`")
    if not 0.2 <= refresh <= 60:
        raise UsageError(f"invalid --refresh {refresh}: seconds from 0.2 to 60")
    make_app = monitor_factory()    # first: a missing extra is what to fix before anything
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("top needs a terminal on stdin and stdout")
    make_app(actions.Settings.socket, refresh_seconds=refresh).run()


def monitor_factory():
    """tui.make_app; Textual loads here only, never for other commands. Textual comes with
    the tui extra, which a client-only install lacks (docs/operations.md): then exit 10 and
    the line to install it."""
    try:
        from tui import make_app
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "textual":
            raise                       # a module of ours missing: a bug, with its traceback
        raise InvalidState("top needs the tui extra (textual is not installed): "
                           "pip install 'gpumemctl[tui]'") from None
    return make_app


@command("doctor")
def doctor(state_dir: Annotated[str | None, typer.Option(
               "--state-dir", help="State directory to check (default: the running daemon's, "
               "else the default).")] = None,
           json_: JsonOpt = False):
    """Check this machine: driver, CUDA, VMM/POSIX-fd/dma-buf per GPU, FUSE, socket...

    Also Python packages and permissions. One line per check: ok, warn or fail, with a hint.

    Exit status: 0 all ok; 1 at worst a warning (e.g. no GPU: host backend); 10 a failure."""
    from . import doctor as diagnosis
    from .protocol import default_socket
    checks = diagnosis.run(actions.Settings.socket or default_socket(), state_dir)
    if want_json(json_):
        output.emit_json(diagnosis.report(checks))
    else:
        for check in checks:
            output.data(check.line())
    return diagnosis.exit_status(checks)


# ---- running it -----------------------------------------------------------------------------
def build_command() -> click.Group:
    """The click tree typer builds from `app`, with the help of positional arguments put
    back: click 8.2+ resets the `help` that typer's TyperArgument sets before calling it."""
    group = typer.main.get_command(app)
    if not isinstance(group, click.Group):      # typer makes one for an app of many commands
        raise TypeError(f"typer built a {type(group).__name__} for gpumemctl, not a group")
    _restore_argument_help(group)
    return group


def _restore_argument_help(cmd: click.Command) -> None:
    for sub in getattr(cmd, "commands", {}).values():
        _restore_argument_help(sub)
    bare = [param for param in cmd.params
            if isinstance(param, click.Argument) and not getattr(param, "help", None)]
    if not bare or cmd.callback is None:
        return
    declared = typer.utils.get_params_from_function(cmd.callback)
    for param in bare:
        param.help = getattr(declared[param.name].default, "help", None)


def run(argv: list[str]) -> int:
    """Run a command line through typer and click; returns the exit status. A usage error
    is one line and a hint on stderr, exit 2 (docs/cli.md)."""
    group = build_command()
    try:
        code = group.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:      # `gpumemctl`, `gpumemctl debug`
        text = exc.format_message()     # the help; typer's rich help printed itself: ""
        if text:
            output.trusted_text(text)
        return USAGE
    except click.UsageError as exc:
        output.usage_error(usage_message(exc), help_hint(exc.ctx))
        return exc.exit_code
    except click.ClickException as exc:
        output.error(exc.format_message())
        return exc.exit_code
    except click.Abort:
        output.error("aborted")
        return 1
    return code if isinstance(code, int) else OK


def usage_message(exc: click.UsageError) -> str:
    """click's message in this program's style: lower case, no full stop, and one
    "did you mean" (click adds its own, worded two ways, in format_message)."""
    alternatives = getattr(exc, "possibilities", None)
    text = exc.message if alternatives else exc.format_message()
    text = text.strip().removesuffix(".")
    if alternatives:
        text += "; did you mean " + " or ".join(repr(a) for a in sorted(alternatives)) + "?"
    return text[:1].lower() + text[1:]


def help_hint(ctx: click.Context | None) -> str | None:
    if ctx is None or not ctx.help_option_names:
        return None
    return f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help."
