"""The detail panel: everything `gpumemctl info` shows about the selected entry."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from gpumemctl.formats import byte_ranges, container_name, metadata_sizes, plain
from gpumemctl.protocol import format_size
from gpumemctl.protocol.escape import escape

# Shown first, in this order; the rest follow sorted, as `info` prints them.
FIRST = ("path", "type", "target", "state", "size", "capacity", "device", "durable", "ecc",
         "verified", "snapshot", "snapshot_time", "holders", "refcount", "damaged")


def _holder(h: Mapping[str, Any]) -> str:
    """`attach-r pid 42 uid 1000`, and `in docker 1a2b3c4d5e6f` where its container is
    known (escaped with the rest of the line)."""
    where = container_name(h.get("container"))
    return f"{h['kind']} pid {h['pid']} uid {h['uid']}" + (f" in {where}" if where else "")


def info_lines(info: Mapping[str, Any]) -> Text:
    """Every field of a node (`info`'s, or a listing's while that comes), by name."""
    keys = [k for k in FIRST if k in info] + sorted(k for k in info if k not in FIRST)
    text = Text()
    for key in keys:
        value = info[key]
        if key == "holders":
            value = ", ".join(_holder(h) for h in value) or "none"
        elif key in ("size", "capacity") and value is not None:
            value = f"{format_size(value)} ({value})"
        elif key == "damaged":
            value = byte_ranges(value)          # as `gpumemctl info` shows them
        elif key == "metadata":
            value = metadata_sizes(value)       # keys and sizes, as `gpumemctl info`
        style = "bold red" if (key == "state" and value in ("degraded", "lost")) else ""
        text.append(f"{key:<12}", style="bold")
        text.append(f" {escape(plain(value))}\n", style=style)    # no bare None or True
    return text


class DetailPanel(VerticalScroll):
    _shown: Mapping[str, Any] | None = None
    def compose(self):
        yield Static(Text("nothing selected", style="dim"), id="detail-body")

    @property
    def shown_path(self) -> str | None:
        return self._shown.get("path") if self._shown else None

    def show(self, info: Mapping[str, Any] | None) -> None:
        if info == self._shown:           # unchanged: no relayout
            return
        self._shown = info
        body = self.query_one("#detail-body", Static)
        body.update(info_lines(info) if info else Text("nothing selected", style="dim"))
