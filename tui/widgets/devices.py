"""The devices panel: per GPU, a memory bar split into our allocations, other users and
free memory (and the slabs' use and slack, and the parity arenas' use, where there are
any), then its health where it is not ok (docs/telemetry.md, "GPU health"), utilisation,
temperature, power, ECC counters and remapped rows."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpumemctl.protocol import format_size
from gpumemctl.protocol.replies import Device

BAR_WIDTH = 24


def memory_split(d: Device) -> tuple[int, int, int, int]:
    """(total, ours, others, free) in bytes. NVML counts every process (ours included);
    without NVML the backend's own total/free are all there is."""
    total = d.get("memory_total") or d.get("total") or 0
    free = d.get("memory_free")
    if free is None:
        free = d.get("free") or 0
    ours = min(d.get("ours") or 0, total)
    others = max(0, total - free - ours)
    return total, ours, others, max(0, total - ours - others)


def bar(total: int, ours: int, others: int, width: int = BAR_WIDTH) -> Text:
    if total <= 0:
        return Text("░" * width, style="dim")
    n_ours = round(width * ours / total)
    n_others = min(width - n_ours, round(width * others / total))
    text = Text()
    text.append("█" * n_ours, style="bold green")
    text.append("▓" * n_others, style="yellow")
    text.append("░" * (width - n_ours - n_others), style="dim")
    return text


def _na(value, fmt: str = "{}") -> str:
    return "n/a" if value is None else fmt.format(value)


def telemetry(d: Device) -> Text:
    """Utilisation, temperature, power, ECC and remapped rows; warnings stand out."""
    if d.get("telemetry") != "nvml":
        return Text(d.get("telemetry") or "no telemetry", style="dim")
    text = Text(f"util {_na(d['utilization_gpu'], '{}%')}  {_na(d['temperature_c'], '{}°C')}"
                f"  {_na(d['power_w'], '{:.0f}')}/{_na(d['power_limit_w'], '{:.0f}W')}  ")
    uncorrected = d.get("ecc_volatile_uncorrected")
    text.append(f"ECC {'on' if d.get('ecc_enabled') else 'off'} "
                f"corr {_na(d.get('ecc_volatile_corrected'))} "
                f"uncorr {_na(uncorrected)}  ",
                style="bold red" if uncorrected else "")
    pending, failure = d.get("remapped_pending"), d.get("remapped_failure")
    text.append(f"remap {_na(d.get('remapped_correctable'))}/"
                f"{_na(d.get('remapped_uncorrectable'))}"
                + (" PENDING" if pending else "") + (" FAILED" if failure else ""),
                style="bold red" if (pending or failure) else "")
    return text


def health(d: Device) -> Text:
    """Nothing while the device is ok; else `LOST (xid 79)` or `DEGRADED (ecc_double)`,
    standing out, first on its telemetry line (the monitor's 80 columns keep it)."""
    h = d.get("health") or {}
    state = h.get("state")
    if not state or state == "ok":
        return Text("")
    cause = h.get("cause") or ""
    if cause == "xid" and h.get("xid") is not None:
        cause = f"xid {h['xid']}"
    return Text(f"{state.upper()}" + (f" ({cause})" if cause else "") + "  ",
                style="bold red" if state == "lost" else "bold yellow")


def device_line(d: Device) -> Text:
    """Two lines: memory, then telemetry; cut (not wrapped) to the panel's width."""
    total, ours, others, free = memory_split(d)
    line = Text(f"{d['index']} ", style="bold", no_wrap=True, overflow="ellipsis")
    line.append_text(bar(total, ours, others))
    line.append(f" ours {format_size(ours)}  other {format_size(others)}  "
                f"free {format_size(free)} of {format_size(total)}  {slab_use(d)}"
                f"{d['name']}\n  ")
    line.append_text(health(d))
    line.append_text(telemetry(d))
    return line


def slab_use(d: Device) -> str:
    """Its slabs' use and slack, and its parity arenas' use (docs/storage.md), where it
    has them: "" otherwise."""
    slabs = d.get("slabs") or {}
    arenas = d.get("parity_arenas") or {}
    text = ""
    if slabs.get("count"):
        text += (f"slabs {format_size(slabs.get('used_bytes', 0))}/"
                 f"{format_size(slabs.get('bytes', 0))} slack "
                 f"{format_size(slabs.get('slack_bytes', 0))}  ")
    if arenas.get("count"):
        text += (f"parity {format_size(arenas.get('used_bytes', 0))}/"
                 f"{format_size(arenas.get('bytes', 0))}  ")
    return text


def compact_line(d: Device) -> Text:
    """One line a device, for servers with many GPUs: bar, ours/free, temp, util, alarms."""
    total, ours, others, free = memory_split(d)
    line = Text(f"{d['index']} ", style="bold", no_wrap=True, overflow="ellipsis")
    line.append_text(bar(total, ours, others, width=16))
    line.append(f" ours {format_size(ours)} free {format_size(free)}/{format_size(total)} ")
    line.append_text(health(d))
    if d.get("telemetry") == "nvml":
        line.append(f"{_na(d['utilization_gpu'], '{}%')} {_na(d['temperature_c'], '{}°C')} "
                    f"{_na(d['power_w'], '{:.0f}W')} ")
        if d.get("ecc_volatile_uncorrected") or d.get("remapped_pending") or \
                d.get("remapped_failure"):
            line.append("ECC/REMAP ALERT", style="bold red")
    return line


COMPACT_FROM = 3        # devices from which each gets one line instead of two


class DevicesPanel(Static):
    """Per device two lines (memory, telemetry), or one each from COMPACT_FROM devices on;
    redrawn from each snapshot."""

    _shown: list | None = None

    def show(self, devices: list[Device]) -> None:
        if devices == self._shown:           # unchanged: no relayout
            return
        self._shown = devices
        if not devices:
            self.update(Text("no devices", style="dim"))
            return
        line = compact_line if len(devices) >= COMPACT_FROM else device_line
        self.update(Text("\n").join(line(d) for d in devices))
