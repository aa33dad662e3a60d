"""`gpumemctl status|metrics|devices|events|top|doctor`: the daemon, its devices and its
event log, the live monitor, and the check of this machine. `status` is declared `plain`
(gpumemctl/cli/plain.py), and `status --json` loads no more than it needs (gpumemctl.formats
is for a person's output); the monitor (tui) and the checks load only when their command
runs."""
from __future__ import annotations

import sys

from .. import output
from ..protocol import InvalidState, UsageError, format_size
from ..protocol.defaults import EVENTS_LIMIT
from ..protocol.errors import OK
from . import context
from .context import connect, want_json
from .declare import JSON, Group, Opt

commands = Group()


@commands.command("status", plain=True, json_=JSON)
def status(json_: bool = False):
    """Daemon, keeper, devices, totals and scrub state."""
    with connect() as c:
        s = c.status()
    if want_json(json_):
        output.emit_json(s)
        return
    from ..formats import health_summary, plain, telemetry_summary
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
        output.data(f"  {health_summary(dev)}")
        slabs = dev.get("slabs") or {}
        if slabs.get("count"):
            output.data(f"  slabs: {slabs['count']} holding {slabs['objects']} small "
                        f"allocations, {format_size(slabs['used_bytes'])} used of "
                        f"{format_size(slabs['bytes'])} (+ {format_size(slabs['parity_bytes'])}"
                        f" parity); slack {format_size(slabs.get('slack_bytes', 0))}, "
                        f"fragmentation {slabs.get('fragmentation', 0.0):.0%}")
        arenas = dev.get("parity_arenas") or {}
        if arenas.get("count"):
            output.data(f"  parity arenas: {arenas['count']}, "
                        f"{format_size(arenas['used_bytes'])} used of "
                        f"{format_size(arenas['bytes'])} by {arenas['spans']} spans")
    states = ", ".join(f"{n} {st}" for st, n in sorted(t["by_state"].items())) or "none"
    output.data(f"totals:   {t['allocations']} allocations ({states}), {t['durable']} durable, "
                f"{format_size(t['size'])} in use, {t['sessions']} sessions")
    if t.get("asleep_bytes"):
        output.data(f"asleep:   {format_size(t['asleep_bytes'])} in host memory "
                    "(gpumemctl wake NAME brings it back)")
    output.data(f"scrub:    {s['scrub']['state']}")


@commands.command("metrics", json_=JSON)
def metrics(json_: bool = False):
    """Prometheus text format for node_exporter's textfile collector (docs/metrics.md).

    Built from one `status` request. When gpumemd is not running it prints `gpumemd_up 0`
    and exits 3, so that the collector shows the daemon down rather than stale numbers."""
    from .. import metrics as prom
    from ..protocol import NotRunning
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


@commands.command("devices", json_=JSON)
def devices(json_: bool = False):
    """Devices of the daemon's backend with NVML telemetry (n/a: NVML cannot say).

    UNCORR: uncorrected ECC errors, volatile/aggregate. REMAP: remapped rows pending/failure.
    HEALTH: ok, degraded or lost, and the last cause (docs/telemetry.md, "GPU health").

    --json prints every field (docs/telemetry.md)."""
    with connect() as c:
        devs = c.devices()
    if want_json(json_):
        output.emit_json(devs)
        return
    from .. import formats
    output.table([[str(d["index"]), d["name"], d["uuid"][:12], formats.memory_use(d),
                   format_size(d["ours"]), formats.na(d.get("utilization_gpu"), "{}%"),
                   formats.na(d.get("temperature_c"), "{}C"), formats.power(d),
                   formats.ecc_mode(d), formats.uncorrected(d), formats.remapped(d),
                   formats.pcie(d), formats.health(d)] for d in devs],
                 ["INDEX", "NAME", "UUID", "MEMORY", "OURS", "UTIL", "TEMP", "POWER", "ECC",
                  "UNCORR", "REMAP", "PCIE", "HEALTH"], right={3, 4, 5, 6, 7})
    for d in devs:
        if d.get("telemetry") != "nvml":
            output.note(f"device {d['index']}: telemetry {d.get('telemetry') or 'unavailable'}")


@commands.command(
    "events",
    follow=Opt("-f", "--follow", help="Keep printing new events."),
    since=Opt("--since", help="Only events after this id."),
    limit=Opt("--limit", "-n", help="At most this many."),
    path=Opt("--path", help="Only this path (and below)."),
    json_=JSON)
def events(follow: bool = False, since: int = 0, limit: int = EVENTS_LIMIT,
           path: str | None = None, json_: bool = False):
    """The event log. With --json --follow, one JSON object per line."""
    from .. import formats
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


@commands.command(
    "top",
    refresh=Opt("--refresh", help="Seconds between snapshots (0.2-60); changes show at once."),
    json_=JSON)
def top(refresh: float = 1.0, json_: bool = False):
    """The live monitor (TUI): devices, allocations, scrub, events; actions by key."""
    if want_json(json_):
        raise UsageError("top is interactive; for scripts use `gpumemctl status --json` and "
                         "`gpumemctl ls -R --json`")
    if not 0.2 <= refresh <= 60:
        raise UsageError(f"invalid --refresh {refresh}: seconds from 0.2 to 60")
    make_app = monitor_factory()    # first: a missing extra is what to fix before anything
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("top needs a terminal on stdin and stdout")
    make_app(context.Settings.socket, refresh_seconds=refresh).run()


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


@commands.command(
    "doctor",
    state_dir=Opt("--state-dir", help="State directory to check (default: the running "
                                      "daemon's, else the default)."),
    json_=JSON)
def doctor(state_dir: str | None = None, json_: bool = False):
    """Check this machine: driver, CUDA, VMM/POSIX-fd/dma-buf per GPU, FUSE, socket...

    Also Python packages and permissions. One line per check: ok, warn or fail, with a hint.

    Exit status: 0 all ok; 1 at worst a warning (e.g. no GPU: host backend); 10 a failure."""
    from .. import doctor as diagnosis
    from ..protocol import default_socket
    checks = diagnosis.run(context.Settings.socket or default_socket(), state_dir)
    if want_json(json_):
        output.emit_json(diagnosis.report(checks))
    else:
        for check in checks:
            output.data(check.line())
    return diagnosis.exit_status(checks)
