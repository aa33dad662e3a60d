"""The allocations panel: a table of one directory (or of every match of the filter below
it), sortable by any column, navigable into directories.

A refresh touches only the cells that changed; the rows are rebuilt only when the set or
order of rows changed. That keeps a refresh of 1000 allocations well inside 100 ms
(bench/tui.py measures it).
"""
from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from .. import model
from ..model import COLUMN_KEYS, COLUMNS, Snapshot


class AllocationTable(DataTable):
    """Rows keyed by path."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._keys: list[str] = []
        self._cells: dict[str, tuple[str, ...]] = {}

    def on_mount(self) -> None:
        for key, header in COLUMNS:
            self.add_column(header, key=key)

    @property
    def selected_path(self) -> str | None:
        if not self._keys or self.cursor_row < 0 or self.cursor_row >= len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def show(self, rows: list[tuple[str, tuple[str, ...]]]) -> None:
        keys = [key for key, _ in rows]
        if keys == self._keys:
            for key, cells in rows:
                old = self._cells[key]
                for column, (before, now) in enumerate(zip(old, cells)):
                    if before != now:
                        self.update_cell(key, COLUMN_KEYS[column], now)
        else:
            selected = self.selected_path
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            if selected in keys:
                self.move_cursor(row=keys.index(selected), animate=False)
        self._keys, self._cells = keys, dict(rows)

    def mark_sort(self, key: str, reverse: bool) -> None:
        for column_key, header in COLUMNS:
            arrow = (" ▼" if reverse else " ▲") if column_key == key else ""
            self.columns[column_key].label = Text(header + arrow)
        self._require_update_dimensions = True
        self.refresh()


class AllocationsPanel(Vertical):
    """The table plus its title line and the filter box."""

    BINDINGS = [
        Binding("slash", "focus_filter", "Filter", show=False),
        Binding("backspace", "up", "Up", show=False),
        Binding("o", "next_sort", "Sort"),
        Binding("O", "reverse_sort", "Reverse", show=False),
    ]

    class Selected(Message):
        """The cursor is on another entry (None: the table is empty)."""

        def __init__(self, entry: dict | None) -> None:
            super().__init__()
            self.entry = entry

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cwd = ""
        self.sort_key, self.reverse = "name", False
        self.snapshot: Snapshot | None = None
        self.now = 0.0
        self._selected: str | None = None

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
                                                     self.now)) for e in shown])
        allocations = sum(1 for e in shown if e["type"] == "allocation")
        where = "/" + self.cwd
        what = f"{allocations} allocations, {len(shown) - allocations} directories"
        match = f"  filter {self.filter_text!r}" if self.filter_text else ""
        self.query_one("#alloc-title", Static).update(
            Text.assemble((where, "bold"), f"  {what}{match}"))
        self._announce()

    def _announce(self) -> None:
        """Tell the app when the selected entry changed, or the entry itself did."""
        path = self.table.selected_path
        entry = self.snapshot.by_path.get(path) if (self.snapshot and path) else None
        if path != self._selected or entry is not None:
            self._selected = path
            self.post_message(self.Selected(entry))

    @property
    def selected_entry(self) -> dict | None:
        path = self.table.selected_path
        return self.snapshot.by_path.get(path) if (self.snapshot and path) else None

    # ---- events and actions -------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._announce()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a directory opens it."""
        event.stop()
        entry = self.selected_entry
        if entry is not None and entry["type"] == "directory":
            self.enter(entry["path"])

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        key = str(event.column_key.value)
        self.set_sort(key, not self.reverse if key == self.sort_key else False)

    def enter(self, path: str) -> None:
        self.cwd = path
        self.query_one("#filter", Input).value = ""
        self._redraw()
        self.table.move_cursor(row=0, animate=False)

    def action_up(self) -> None:
        if self.filter_text:
            self.query_one("#filter", Input).value = ""
            return
        if self.cwd:
            came_from, self.cwd = self.cwd, model.parent_of(self.cwd)
            self._redraw()
            if came_from in self.table._keys:
                self.table.move_cursor(row=self.table._keys.index(came_from), animate=False)

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_next_sort(self) -> None:
        index = (COLUMN_KEYS.index(self.sort_key) + 1) % len(COLUMN_KEYS)
        self.set_sort(COLUMN_KEYS[index], False)

    def action_reverse_sort(self) -> None:
        self.set_sort(self.sort_key, not self.reverse)

    def set_sort(self, key: str, reverse: bool) -> None:
        self.sort_key, self.reverse = key, reverse
        self.table.mark_sort(key, reverse)
        self._redraw()
