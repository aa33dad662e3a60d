"""The live event log (the `subscribe` stream), newest at the bottom."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from gpumemctl.formats import event_line
from gpumemctl.protocol.escape import escape
from gpumemctl.protocol.replies import Event

ALARMING = {"damage", "lost", "orphan", "unsealed"}


class EventsPanel(RichLog):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=1000, wrap=False, markup=False, **kwargs)
        self.last_id = 0

    def add(self, event: Event) -> None:
        if event["id"] <= self.last_id:           # a backlog replayed after a reconnect
            return
        self.last_id = event["id"]
        style = "bold red" if event["kind"] in ALARMING else \
            ("green" if event["kind"] == "healed" else "")
        self.write(Text(escape(event_line(event, date=False)), style=style))
