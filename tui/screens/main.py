"""The main screen: devices on top, the allocation table with the detail beside it, scrub
progress and the event log below, the key bindings in the footer."""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import events
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from ..widgets.allocations import AllocationsPanel
from ..widgets.detail import DetailPanel
from ..widgets.devices import DevicesPanel
from ..widgets.events import EventsPanel
from ..widgets.scrub import ScrubPanel

if TYPE_CHECKING:
    from ..app import GpumemApp  # which imports this module


class Banner(Widget):
    """The one-line summary at the top. Its text changes every second (uptime), so it
    repaints without the relayout a Static's update() costs."""

    DEFAULT_CSS = "Banner { height: 1; }"
    text = Text()

    def show(self, text: Text) -> None:
        if text.plain != self.text.plain:
            self.text = text
            self.refresh()

    def render(self) -> Text:
        return self.text


WIDE = 100          # columns from which the detail panel shows
ROOMY = 104         # columns from which the footer's keys fit with padding and ^p (102 now)


class MainScreen(Screen):
    # Below WIDE columns the detail panel gives its room to the table.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE, "-wide")]

    ready = False                   # children composed: the app may draw into them

    def compose(self):
        yield Banner(id="banner")
        yield DevicesPanel(id="devices")
        with Horizontal(id="middle"):
            yield AllocationsPanel(id="allocations")
            yield DetailPanel(id="detail")
        with Horizontal(id="bottom"):
            yield ScrubPanel(id="scrub")
            yield EventsPanel(id="events")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#devices").border_title = "devices"
        self.query_one("#allocations").border_title = "allocations"
        self.query_one("#detail").border_title = "detail"
        self.query_one("#scrub").border_title = "scrub"
        self.query_one("#events").border_title = "events"
        self.query_one("#alloc-table").focus()
        self.ready = True
        app = cast("GpumemApp", self.app)     # the one app this screen belongs to
        if app.snapshot is not None:          # it arrived before we were ready; draw
            # once the screen runs, so the panels' messages (the selection) are delivered
            self.call_after_refresh(app.draw, app.snapshot)

    def on_resize(self, event: events.Resize) -> None:
        """Below ROOMY columns the footer packs its keys closer and leaves the command
        palette's ^p out (the key still works), so that every key, Quit included, fits in
        80 columns."""
        narrow = event.size.width < ROOMY
        footer = self.query_one(Footer)
        footer.compact = narrow
        if footer.show_command_palette == narrow:
            footer.show_command_palette = not narrow
            footer.refresh(recompose=True)

    def on_unmount(self) -> None:
        self.ready = False                    # the app is closing: draw nothing more
