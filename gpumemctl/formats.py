"""How values are read from and written for people, shared by the CLI and the TUI
(`gpumemctl top`). Standard library only, imported where used: the CLI loads this module
for the human output of its fast path (gpumemctl/cli/plain.py), where every module counts.
The daemon's answers it reads are typed in gpumemctl/protocol/replies.py.

Nothing here prints Python's `None`, `True` or a list repr: a value that is not known is
`-` (or `n/a` for GPU telemetry that NVML cannot give), and a field without a value is left
out of event lines.
"""
from __future__ import annotations

import datetime
import functools
import time

from .protocol import UsageError, format_size

TYPE_CHECKING = False               # typing is not imported at run time (the CLI's start-up)
if TYPE_CHECKING:
    from .protocol.replies import Device, Event


def parse_mode(text: str) -> int:
    """Octal permission bits, e.g. "0640"; anything else is a usage error naming it."""
    text = text.strip()
    if not (1 <= len(text) <= 4 and all(ch in "01234567" for ch in text)):
        raise UsageError(f"invalid mode '{text}': expected octal permission bits 0000-7777, "
                         "such as 0640")
    return int(text, 8)


def duration(seconds: float | None, unknown: str = "unknown") -> str:
    """12s, 3m05s, 1h02m05s."""
    if seconds is None:
        return unknown
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def age(iso: str | None, now: float, never: str = "never") -> str:
    """'12s ago', '5m ago', '3h ago', '2d ago' for an ISO 8601 UTC time; `never` for None."""
    if not iso:
        return never
    seconds = max(0, int(now - epoch(iso)))
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds // span}{unit} ago"
    return f"{seconds}s ago"


@functools.lru_cache(maxsize=1 << 14)   # the same times come back every refresh
def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def event_line(e: Event, *, date: bool = True) -> str:
    """One event as `gpumemctl events` prints it; without `date`, the time of day only
    and no id (the TUI's narrow events panel). Details without a value are left out."""
    import datetime
    when = datetime.datetime.fromtimestamp(e["time_ns"] / 1e9, tz=datetime.UTC)
    who = f" uid={e['uid']}" if e.get("uid") is not None else ""
    detail = " ".join(f"{k}={v}" for k, v in sorted(e.get("detail", {}).items())
                      if v is not None)
    head = f"{e['id']:>6} {when:%Y-%m-%dT%H:%M:%SZ}" if date else f"{when:%H:%M:%S}"
    return f"{head} {e['kind']:<9} {e.get('path') or '-'}{who} {detail}".rstrip()


def byte_ranges(ranges: list, limit: int | None = None) -> str:
    """[[0, 131072], [262144, 393216]] (half-open) as "0-131071, 262144-393215"; "none".
    Every byte range shown to a person is written this way: first and last byte, both
    included (docs/cli.md); JSON keeps the half-open pairs. With `limit`, the first
    `limit` ranges and how many more there are."""
    shown = ranges if limit is None else ranges[:limit]
    text = ", ".join(f"{start}-{end - 1}" for start, end in shown) or "none"
    more = len(ranges) - len(shown)
    return f"{text}, ... ({more} more)" if more > 0 else text


def metadata_sizes(metadata: dict | None) -> str:
    """`info`'s user metadata for a person: each key with its value's size in bytes (the
    values are `gpumemctl meta get`'s to show); `-` when there is none, or when the caller
    may not read it (null)."""
    if not metadata:
        return "-"
    return ", ".join(f"{key} ({len(value.encode('utf-8', 'surrogateescape'))} B)"
                     for key, value in metadata.items())


def plain(value) -> str:
    """A JSON value for a person: `-` for null, yes/no for booleans, lists comma-joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value) or "none"
    return str(value)


# ---- GPU telemetry (fields: docs/telemetry.md; None is shown as n/a) ----------------------
def na(value, template: str = "{}") -> str:
    return "n/a" if value is None else template.format(value)


def yes_no(value) -> str:
    return "n/a" if value is None else ("YES" if value else "no")


def memory_use(d: Device) -> str:
    """NVML's view (every process on the GPU) where there is one, else the backend's."""
    used, total = d.get("memory_used"), d.get("memory_total")
    if used is not None and total is not None:
        return f"{format_size(used)}/{format_size(total)}"
    return f"{format_size(d['total'] - d['free'])}/{format_size(d['total'])}"


def power(d: Device) -> str:
    if d.get("power_w") is None:
        return "n/a"
    return f"{d['power_w']:.0f}/{na(d.get('power_limit_w'), '{:.0f}')}W"


def ecc_mode(d: Device) -> str:
    now, pending = d.get("ecc_enabled"), d.get("ecc_enabled_pending")
    if now is None:
        return "n/a"
    text = "on" if now else "off"
    if pending is not None and pending != now:
        text += "->" + ("on" if pending else "off") + " at reset"
    return text


def uncorrected(d: Device) -> str:
    vol, agg = d.get("ecc_volatile_uncorrected"), d.get("ecc_aggregate_uncorrected")
    return "n/a" if vol is None and agg is None else f"{na(vol)}/{na(agg)}"


def remapped(d: Device) -> str:
    pending, failure = d.get("remapped_pending"), d.get("remapped_failure")
    return "n/a" if pending is None and failure is None else \
        f"{yes_no(pending)}/{yes_no(failure)}"


def pcie(d: Device) -> str:
    if d.get("pcie_gen") is None and d.get("pcie_width") is None:
        return "n/a"
    return f"gen{na(d.get('pcie_gen'))} x{na(d.get('pcie_width'))}"


def telemetry_summary(d: Device) -> str:
    """The essentials of one GPU on one line (for `status`)."""
    if d.get("telemetry") != "nvml":
        return f"telemetry {d.get('telemetry') or 'unavailable'}"
    return (f"util {na(d.get('utilization_gpu'), '{}%')}, "
            f"{na(d.get('temperature_c'), '{}C')}, {power(d)}, ECC {ecc_mode(d)} "
            f"(uncorrected volatile/aggregate {uncorrected(d)}), remapped rows "
            f"pending/failure {remapped(d)}, PCIe {pcie(d)}")


def health(d: Device) -> str:
    """A device's health (docs/telemetry.md, "GPU health"): `ok`, or the state and its last
    cause, `degraded (ecc_double)`, `lost (xid 79)`."""
    h = d.get("health") or {}
    state = h.get("state") or "n/a"
    if state == "ok" or not h.get("cause"):
        return state
    cause = f"xid {h['xid']}" if h.get("cause") == "xid" and h.get("xid") is not None \
        else h["cause"]
    return f"{state} ({cause})"


def health_summary(d: Device) -> str:
    """`status`'s health line of a device: the state, the last cause and when, the counts."""
    h = d.get("health") or {}
    counts = ", ".join(f"{cause} {n}" for cause, n in sorted((h.get("counts") or {}).items())
                       if n) or "no incidents"
    when = ""
    if h.get("at"):
        when = " at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["at"]))
    return f"health {health(d)}{when}; {counts}; watched by {h.get('monitor') or 'n/a'}"


def container_name(container: dict | None) -> str | None:
    """A holder's container for people (docs/operations.md, "Containers"): `docker
    1a2b3c4d5e6f` (the runtime and the id's first 12 characters, as `docker ps`), with
    `pod UID` for a Kubernetes pod; None without one. The caller escapes it."""
    if not isinstance(container, dict):
        return None
    cid, pod = container.get("id"), container.get("pod")
    parts = [str(container.get("runtime") or "container")]
    if cid:
        parts.append(str(cid)[:12])
    if pod:
        parts.append(f"pod {pod}")
    return " ".join(parts)
