"""The `gpumemctl` command line (typer).

Pinned surface and exit codes: DESIGN.md and docs/cli.md. Every command takes `--json`
(or the global one); with it, stdout is one JSON document. Errors are one line on stderr and
the exit status is the error's protocol code. This module must not import textual, cuda or
pynvml at module scope (a test checks): `gpumemctl ls` has to start fast.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Annotated, Optional

import typer

from . import output
from .formats import duration, event_line, parse_mode
from .protocol import GpumemError, UsageError, format_size, parse_size
from .protocol.errors import INVALID_STATE, OK, REPAIRED, UNCORRECTABLE

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Inspect and manage durable GPU memory served by gpumemd.",
                  context_settings={"help_option_names": ["-h", "--help"]})


class Settings:
    socket: Optional[str] = None
    json: bool = False


# ---- shared option types (defined once, used by every command) ---------------------------
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (for scripts).")]


def complete_name(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """TAB on an allocation name: ask the daemon (gpumemctl/completion.py)."""
    from .completion import allocation_names
    return allocation_names(ctx.find_root().params.get("socket"), incomplete)


NameArg = Annotated[str, typer.Argument(help="Allocation name, e.g. models/llama.",
                                        autocompletion=complete_name)]
NamesArg = Annotated[list[str], typer.Argument(help="One or more allocation names.",
                                               autocompletion=complete_name)]
OffsetOpt = Annotated[str, typer.Option("--offset", help="Byte offset (sizes like 4K work).")]


@app.callback()
def main_options(
    socket: Annotated[Optional[str], typer.Option(
        "--socket", envvar="GPUMEMD_SOCKET", help="gpumemd's socket.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="JSON output for every command.")]
    = False,
) -> None:
    Settings.socket = socket
    Settings.json = json_


def want_json(flag: bool) -> bool:
    return flag or Settings.json


def connect():
    from .client import Client
    return Client(Settings.socket)


def command(*names, **kwargs):
    """Register a command whose GpumemErrors become one stderr line and their exit code."""
    def wrap(func):
        @functools.wraps(func)
        def run(*args, **kw):
            try:
                code = func(*args, **kw)
            except GpumemError as exc:
                output.error(str(exc))
                raise typer.Exit(exc.code) from None
            except BrokenPipeError:
                # `gpumemctl read x | head`: the reader left; that is not our error.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(OK) from None
            raise typer.Exit(code or OK)
        app.command(*names, **kwargs)(run)
        return func
    return wrap


def parse_offset(text: str, what: str = "offset") -> int:
    return 0 if text in ("0", "") else parse_size(text, allow_zero=True)


# ---- namespace ----------------------------------------------------------------------------
def _ls_row(e: dict) -> list[str]:
    name = e["path"] + ("/" if e["type"] == "directory" else "")
    if e["type"] == "directory":
        return [_mode_string(e), f"{e['uid']}:{e['gid']}", "-", "-", "-", "-", "dir", "-",
                "-", e["modified"][:19], name]
    return [_mode_string(e), f"{e['uid']}:{e['gid']}", format_size(e["size"]),
            format_size(e["capacity"]), (e["device"] or "-")[:13],
            "durable" if e["durable"] else "transient", e["state"], e["ecc"],
            str(e["refcount"]), e["modified"][:19], name]


def _mode_string(e: dict) -> str:
    mode = int(e["mode"], 8)
    kind = "d" if e["type"] == "directory" else "-"
    bits = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    if mode & 0o1000:
        bits = bits[:8] + ("t" if mode & 1 else "T")
    return kind + bits


@command("ls")
def ls(path: Annotated[str, typer.Argument(help="Directory or allocation.",
                                           autocompletion=complete_name)] = "",
       long: Annotated[bool, typer.Option("-l", "--long", help="Long listing.")] = False,
       recursive: Annotated[bool, typer.Option("-R", "--recursive",
                                               help="List directories' contents too.")]
       = False,
       json_: JsonOpt = False):
    """List allocations and directories."""
    with connect() as c:
        entries = c.ls(path, recursive=recursive)
    if want_json(json_):
        output.emit_json(entries)
    elif long:
        output.table([_ls_row(e) for e in entries],
                     ["MODE", "OWNER", "SIZE", "CAPACITY", "DEVICE", "DURABILITY", "STATE",
                      "ECC", "REFS", "MODIFIED", "NAME"], right={2, 3, 8})
    else:
        for e in entries:
            output.data(e["path"] + ("/" if e["type"] == "directory" else ""))


@command("create")
def create(name: NameArg,
           size: Annotated[str, typer.Option("--size", "-s", help="e.g. 4096, 64K, 1.5G, 2GB.")],
           durable: Annotated[bool, typer.Option("--durable", help="Survive daemon restarts.")]
           = False,
           device: Annotated[Optional[str], typer.Option("--device",
                                                         help="Device index or UUID.")] = None,
           mode: Annotated[str, typer.Option("--mode", help="Octal permissions.")] = "0600",
           ecc: Annotated[Optional[str], typer.Option(
               "--ecc", help="rs or none (default: the daemon's, rs unless configured).")]
           = None,
           exist_ok: Annotated[bool, typer.Option(
               "--exist-ok", help="Succeed if it exists with this size.")] = False,
           json_: JsonOpt = False):
    """Allocate NAME (missing parent directories are created)."""
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


@command("mkdir")
def mkdir(name: NameArg,
          parents: Annotated[bool, typer.Option(
              "-p", "--parents", help="Create missing parents; no error if it exists.")]
          = False,
          mode: Annotated[str, typer.Option("--mode", help="Octal permissions.")] = "0755",
          json_: JsonOpt = False):
    """Create a directory."""
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


@command("rm")
def rm(names: NamesArg,
       recursive: Annotated[bool, typer.Option("-r", "-R", "--recursive",
                                               help="Remove directories and their contents.")]
       = False,
       force: Annotated[bool, typer.Option(
           "-f", "--force", help="Remove even while held; memory goes with the last holder.")]
       = False,
       json_: JsonOpt = False):
    """Free allocations (and, with -r, directories)."""
    return _each(names, lambda c, n: c.remove(n, recursive=recursive, force=force), json_)


@command("durable")
def durable(names: NamesArg, json_: JsonOpt = False):
    """Mark allocations durable: they survive client and daemon crashes."""
    return _each(names, lambda c, n: c.set_durable(n, True), json_)


@command("transient")
def transient(names: NamesArg, json_: JsonOpt = False):
    """Mark allocations transient: freed when the daemon stops."""
    return _each(names, lambda c, n: c.set_durable(n, False), json_)


@command("info")
def info(name: NameArg, json_: JsonOpt = False):
    """Everything known about one allocation or directory."""
    with connect() as c:
        data = c.info(name)
    if want_json(json_):
        output.emit_json(data)
        return
    for key in sorted(data):
        if key == "holders":
            holders = data[key]
            output.data(f"{'holders':18} " + (", ".join(
                f"{h['kind']} (pid {h['pid']}, uid {h['uid']})" for h in holders) or "none"))
        elif key in ("size", "capacity") and data[key] is not None:
            output.data(f"{key:18} {data[key]} ({format_size(data[key])})")
        else:
            output.data(f"{key:18} {data[key]}")


# ---- data -----------------------------------------------------------------------------------
@command("write")
def write(name: NameArg,
          file: Annotated[str, typer.Argument(help="Input file, or - for stdin.")] = "-",
          offset: OffsetOpt = "0", json_: JsonOpt = False):
    """Write FILE (or stdin) into NAME at --offset."""
    start = parse_offset(offset)
    src = sys.stdin.buffer if file == "-" else _open_input(file)
    total = os.fstat(src.fileno()).st_size if file != "-" else None
    meter = output.Progress(f"write {name}", total or 0)
    with connect() as c:
        done = c.write_from(name, src, start, progress=meter, total=total)
    meter.finish()
    if want_json(json_):
        output.emit_json({"name": name, "offset": start, "bytes": done})


def _open_input(path: str):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


@command("read")
def read(name: NameArg,
         file: Annotated[str, typer.Argument(help="Output file, or - for stdout.")] = "-",
         offset: OffsetOpt = "0",
         length: Annotated[Optional[str], typer.Option("--length",
                                                       help="Bytes to read.")] = None):
    """Read NAME (from --offset, --length bytes) to FILE or stdout."""
    start = parse_offset(offset)
    count = None if length is None else parse_size(length, allow_zero=True)
    out = sys.stdout.buffer if file == "-" else open(file, "wb")
    with connect() as c:
        total = count if count is not None else max((c.info(name).get("size") or 0) - start, 0)
        meter = output.Progress(f"read {name}", total)
        c.read_to(name, out, start, count, progress=meter)
    out.flush()
    meter.finish()


# ---- daemon ---------------------------------------------------------------------------------
@command("status")
def status(json_: JsonOpt = False):
    """Daemon, keeper, devices, totals and scrub state."""
    with connect() as c:
        s = c.status()
    if want_json(json_):
        output.emit_json(s)
        return
    d, k, t = s["daemon"], s["keeper"], s["totals"]
    output.data(f"daemon:   gpumemd {d['version']} pid {d['pid']}, backend {d['backend']}, "
                f"up {d['uptime_s']:.0f}s, socket {d['socket']}")
    keeper = f"pid {k.get('pid')}, holding {k.get('held')} allocations ({k.get('fds')} fds)" \
        if k.get("alive") else f"NOT RUNNING ({k.get('error')})"
    output.data(f"keeper:   {k['kind']} {keeper}")
    for dev in s["devices"]:
        output.data(f"device {dev['index']}: {dev['name']} {dev['uuid']}: "
                    f"{format_size(dev['ours'])} ours, {format_size(dev['free'])} free of "
                    f"{format_size(dev['total'])}; {_telemetry_summary(dev)}")
    states = ", ".join(f"{n} {st}" for st, n in sorted(t["by_state"].items())) or "none"
    output.data(f"totals:   {t['allocations']} allocations ({states}), {t['durable']} durable, "
                f"{format_size(t['size'])} in use, {t['sessions']} sessions")
    output.data(f"scrub:    {s['scrub']['state']}")


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
        sys.stdout.write(prom.render(families))
    return code


# ---- GPU telemetry (fields: docs/telemetry.md; None is shown as n/a) ----------------------
def _na(value, template: str = "{}") -> str:
    return "n/a" if value is None else template.format(value)


def _yes_no(value) -> str:
    return "n/a" if value is None else ("YES" if value else "no")


def _memory(d: dict) -> str:
    """NVML's view (every process on the GPU) where there is one, else the backend's."""
    if d.get("memory_used") is not None and d.get("memory_total") is not None:
        return f"{format_size(d['memory_used'])}/{format_size(d['memory_total'])}"
    return f"{format_size(d['total'] - d['free'])}/{format_size(d['total'])}"


def _power(d: dict) -> str:
    if d.get("power_w") is None:
        return "n/a"
    return f"{d['power_w']:.0f}/{_na(d.get('power_limit_w'), '{:.0f}')}W"


def _ecc_mode(d: dict) -> str:
    now, pending = d.get("ecc_enabled"), d.get("ecc_enabled_pending")
    if now is None:
        return "n/a"
    text = "on" if now else "off"
    if pending is not None and pending != now:
        text += "->" + ("on" if pending else "off") + " at reset"
    return text


def _uncorrected(d: dict) -> str:
    vol, agg = d.get("ecc_volatile_uncorrected"), d.get("ecc_aggregate_uncorrected")
    return "n/a" if vol is None and agg is None else f"{_na(vol)}/{_na(agg)}"


def _remap(d: dict) -> str:
    pending, failure = d.get("remapped_pending"), d.get("remapped_failure")
    return "n/a" if pending is None and failure is None else \
        f"{_yes_no(pending)}/{_yes_no(failure)}"


def _pcie(d: dict) -> str:
    if d.get("pcie_gen") is None and d.get("pcie_width") is None:
        return "n/a"
    return f"gen{_na(d.get('pcie_gen'))} x{_na(d.get('pcie_width'))}"


def _telemetry_summary(d: dict) -> str:
    """The essentials of one GPU on one line (for `status`)."""
    if d.get("telemetry") != "nvml":
        return f"telemetry {d.get('telemetry') or 'unavailable'}"
    return (f"util {_na(d.get('utilization_gpu'), '{}%')}, "
            f"{_na(d.get('temperature_c'), '{}C')}, {_power(d)}, ECC {_ecc_mode(d)} "
            f"(uncorrected volatile/aggregate {_uncorrected(d)}), remapped rows "
            f"pending/failure {_remap(d)}, PCIe {_pcie(d)}")


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
    output.table([[str(d["index"]), d["name"], d["uuid"][:12], _memory(d),
                   format_size(d["ours"]), _na(d.get("utilization_gpu"), "{}%"),
                   _na(d.get("temperature_c"), "{}C"), _power(d), _ecc_mode(d),
                   _uncorrected(d), _remap(d), _pcie(d)] for d in devs],
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
           = 100,
           path: Annotated[Optional[str], typer.Option("--path",
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
                    output.data(__import__("json").dumps(e) if as_json else event_line(e))
                    sys.stdout.flush()
            except KeyboardInterrupt:
                return OK
        evs = c.events(since=since, limit=limit, path=path)
    if as_json:
        output.emit_json(evs)
    else:
        for e in evs:
            output.data(event_line(e))


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
        parts.append(f"{len(r['damaged'])} damaged (not repaired: use --repair)")
    if r["uncorrectable"]:
        parts.append(f"{r['uncorrectable']} UNCORRECTABLE")
    if r["skipped"]:
        parts.append(f"{r['skipped']} skipped (written since the last sync, or unsealed)")
    line = f"{r['path']}: " + ", ".join(parts)
    if r.get("damaged_ranges"):
        line += "; damaged bytes: " + ", ".join(f"{a}-{b - 1}" for a, b in r["damaged_ranges"])
    return line


@command("verify")
def verify(names: Annotated[Optional[list[str]], typer.Argument(
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
    from datetime import datetime, timezone
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


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
                f"{duration(eta)} to go" + (f", rate limit {format_size(st['rate'])}/s"
                                             if st.get("rate") else ""),
                f"  {_scrub_counts(t)}"]
    last = st.get("last")
    if not last:
        return ["scrub: none has run yet"]
    t = last["totals"]
    how = "stopped" if last["stopped"] else "finished"
    rate = f" at {format_size(int(last['rate']))}/s" if last.get("rate") else ""
    lines = [f"scrub: {how} {_when(last['finished_ns'])} after "
             f"{duration(last['seconds'])}: {format_size(t['bytes'])} scrubbed{rate}",
             f"  {_scrub_counts(t)}"]
    for alloc in last.get("allocations", {}).values():
        if alloc["corrected"] or alloc["uncorrectable"]:
            lines.append(f"  {alloc['path']}: {_scrub_counts(alloc)}")
    return lines


def scrub_exit(st: dict) -> int:
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
RateOpt = Annotated[Optional[str], typer.Option(
    "--rate", help="At most this many bytes/s (e.g. 2G); default: 10% of the time, leaving "
                   "90% of the bandwidth to users.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="With --wait: print nothing "
                                        "when all is clean.")]


@scrub_app.callback()
def scrub(ctx: typer.Context, wait: WaitOpt = False, rate: RateOpt = None,
          quiet: QuietOpt = False, json_: JsonOpt = False):
    """Start a scrub (`gpumemctl scrub` or `scrub start`), or: scrub status, scrub stop."""
    if ctx.invoked_subcommand is None:
        _scrub_start(wait, rate, quiet, json_)


@scrub_app.command("start")
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
def scrub_status(json_: JsonOpt = False):
    """Progress, rate and ETA of a running scrub; the last result otherwise."""
    st = _scrub_call("status")
    if want_json(json_):
        output.emit_json(st)
    else:
        for line in scrub_report(st):
            output.data(line)


@scrub_app.command("stop")
def scrub_stop(json_: JsonOpt = False):
    """Stop the running scrub (its counters so far become the last result)."""
    st = _scrub_call("stop")
    if want_json(json_):
        output.emit_json(st)
    else:
        output.data("scrub: stopping")


debug_app = typer.Typer(help="Fault injection for tests and drills (gpumemd "
                             "--enable-fault-injection).", no_args_is_help=True)
app.add_typer(debug_app, name="debug")


@debug_app.command("corrupt")
def debug_corrupt(name: NameArg,
                  offset: OffsetOpt = "0",
                  length: Annotated[str, typer.Option("--length", help="Bytes to change.")]
                  = "1",
                  parity: Annotated[bool, typer.Option(
                      "--parity", help="Change the parity region instead of the data.")]
                  = False,
                  pattern: Annotated[str, typer.Option(
                      "--pattern", help="Hex bytes written, repeated (default ff).")] = "ff",
                  json_: JsonOpt = False):
    """Overwrite bytes without updating the parity (refused unless gpumemd runs with
    --enable-fault-injection; root or the daemon's user only)."""
    try:
        with connect() as c:
            result = c.debug_corrupt(name, offset=parse_offset(offset),
                                     length=parse_offset(length, "length"), parity=parity,
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
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("top needs a terminal on stdin and stdout")
    from tui import make_app            # Textual loads here only, never for other commands
    make_app(Settings.socket, refresh_seconds=refresh).run()


@command("doctor")
def doctor(state_dir: Annotated[Optional[str], typer.Option(
               "--state-dir", help="State directory to check (default: the running daemon's, "
               "else the default).")] = None,
           json_: JsonOpt = False):
    """Check this machine: driver, CUDA, VMM/POSIX-fd/dma-buf per GPU, FUSE, socket...

    Also Python packages and permissions. One line per check: ok, warn or fail, with a hint.

    Exit status: 0 all ok; 1 at worst a warning (e.g. no GPU: host backend); 10 a failure."""
    from . import doctor as diagnosis
    from .protocol import default_socket
    checks = diagnosis.run(Settings.socket or default_socket(), state_dir)
    if want_json(json_):
        output.emit_json(diagnosis.report(checks))
    else:
        for check in checks:
            output.data(check.line())
    return diagnosis.exit_status(checks)


def main() -> None:
    from .completion import requested, run
    if requested():                 # started by a completion script (completions/)
        sys.exit(run(requested()))
    app()


if __name__ == "__main__":
    main()
