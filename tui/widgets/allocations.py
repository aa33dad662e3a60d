"""The allocations panel: a table of one directory (or of every match of the filter below
it), sortable by any column, navigable into directories.

The table draws only the rows on screen (widgets/table.py), so a refresh of 1000
allocations stays well inside 100 ms (bench/top.py measures it).
"""
from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Static

from gpumemctl.protocol.escape import escape
from gpumemctl.protocol.replies import Node

from .. import model
from ..model import COLUMN_KEYS, COLUMNS, Snapshot
from .table import Table

RIGHT = {1, 2, 6, 7}   # size, capacity, holders, links: numbers line up on the right
ALARM_STATES = {"degraded", "lost"}


class AllocationTable(Table):
    """The table of allocations, rows keyed by path."""

    def __init__(self, **kwargs) -> None:
        super().__init__([header for _, header in COLUMNS], right=RIGHT, **kwargs)

    @property
    def selected_path(self) -> str | None:
        return self.selected_key

    def mark_sort(self, key: str, reverse: bool) -> None:
        self.set_headers([header + ((" ▼" if reverse else " ▲") if k == key else "")
                          for k, header in COLUMNS])


class AllocationsPanel(Vertical):
    """The table plus its title line and the filter box."""

    BINDINGS = [
        Binding("slash", "focus_filter", "Filter", show=False),
        Binding("escape", "leave_filter", "Table", show=False),
        Binding("backspace", "up", "Up", show=False),
        Binding("o", "next_sort", "Sort"),
        Binding("O", "reverse_sort", "Reverse", show=False),
    ]

    class Selected(Message):
        """The cursor is on another entry (None: the table is empty)."""

        def __init__(self, entry: Node | None) -> None:
            super().__init__()
            self.entry = entry

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cwd = ""
        self.sort_key, self.reverse = "name", False
        self.snapshot: Snapshot | None = None
        self.now = 0.0
        self._selected: Node | None = None   # the entry last announced

    def compose(self):
        yield Static(id="alloc-title")
        yield Input(placeholder="filter: type to match paths below this directory",
                    id="filter")
        yield AllocationTable(id="alloc-table")

    @property
    def table(self) -> AllocationTable:
        return self.query_one(AllocationTable)

    @property
    def filter_text(self) -> str:
        return self.query_one("#filter", Input).value.strip()

    def on_mount(self) -> None:
        self.table.mark_sort(self.sort_key, self.reverse)

    # ---- drawing ------------------------------------------------------------------------
    def show(self, snapshot: Snapshot, now: float) -> None:
        self.snapshot, self.now = snapshot, now
        self._redraw()

    def _redraw(self) -> None:
        snap = self.snapshot
        if snap is None:
            return
        if self.cwd and self.cwd not in snap.by_path:       # removed under our feet
            self.cwd = ""
        shown = model.sorted_entries(model.visible(snap.entries, self.cwd, self.filter_text),
                                     self.sort_key, self.reverse, snap.device_index)
        self.table.show([(e["path"], model.row_cells(e, self.cwd, snap.device_index,
                                                     self.now)) for e in shown],
                        alarm={i for i, e in enumerate(shown)
                               if e.get("state") in ALARM_STATES})
        allocations = sum(1 for e in shown if e["type"] == "allocation")
        where = "/" + escape(self.cwd)
        what = f"{allocations} allocations, {len(shown) - allocations} directories"
        match = f"  filter '{escape(self.filter_text)}'" if self.filter_text else ""
        self.query_one("#alloc-title", Static).update(
            Text.assemble((where + "  ", "bold"), f"{what}{match}"))
        self._announce()

    def _announce(self) -> None:
        """Tell the app when the selected entry changed (another row, or new values)."""
        entry = self.selected_entry
        if entry != self._selected:
            self._selected = entry
            self.post_message(self.Selected(entry))

    @property
    def selected_entry(self) -> Node | None:
        path = self.table.selected_path
        return self.snapshot.by_path.get(path) if (self.snapshot and path) else None

    # ---- events and actions -------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.table.focus()

    def on_table_highlighted(self, event: Table.Highlighted) -> None:
        event.stop()
        self._announce()

    def on_table_activated(self, event: Table.Activated) -> None:
        """Enter on a directory opens it."""
        event.stop()
        entry = self.selected_entry
        if entry is not None and entry["type"] == "directory":
            self.enter(entry["path"])

    def on_table_header_clicked(self, event: Table.HeaderClicked) -> None:
        event.stop()
        key = COLUMN_KEYS[event.column]
        self.set_sort(key, not self.reverse if key == self.sort_key else False)

    def enter(self, path: str) -> None:
        self.cwd = path
        self.query_one("#filter", Input).value = ""
        self._redraw()
        self.table.move_cursor(0)

    def action_up(self) -> None:
        if self.filter_text:
            self.query_one("#filter", Input).value = ""
            return
        if self.cwd:
            came_from, self.cwd = self.cwd, model.parent_of(self.cwd)
            self._redraw()
            if came_from in self.table.keys:
                self.table.move_cursor(self.table.keys.index(came_from))

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def check_action(self, action: str, parameters) -> bool | None:
        """Esc is the filter's only: in the table it goes on to the screen and the app."""
        if action == "leave_filter":
            return self.query_one("#filter", Input).has_focus
        return True

    def action_leave_filter(self) -> None:
        """Esc in the filter: back to the table, whose keys act again. The filter stays,
        as after Enter; Backspace in the table clears it."""
        self.table.focus()

    def action_next_sort(self) -> None:
        index = (COLUMN_KEYS.index(self.sort_key) + 1) % len(COLUMN_KEYS)
        self.set_sort(COLUMN_KEYS[index], False)

    def action_reverse_sort(self) -> None:
        self.set_sort(self.sort_key, not self.reverse)

    def set_sort(self, key: str, reverse: bool) -> None:
        self.sort_key, self.reverse = key, reverse
        self.table.mark_sort(key, reverse)
        self._redraw()
