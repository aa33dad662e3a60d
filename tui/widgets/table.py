"""A fast, read-only table for many rows: Textual's line API (ScrollView.render_line), so a
refresh draws only the rows on screen and replacing all 1000 rows costs a list assignment,
not a widget per cell. DataTable measured 100-470 ms per refresh at 1000 rows here
(bench/top.py); this stays within a few ms.

The header row stays put while the rows scroll; a click on it asks to sort by that column.
"""
from __future__ import annotations

from collections.abc import Set

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpumemctl.protocol.escape import escape

GAP = 2                # spaces between columns
MAX_NAME = 48          # the first column is cut (with …) past this width


class Table(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"table--header", "table--cursor", "table--odd", "table--alarm"}
    DEFAULT_CSS = """
    Table { background: $surface; }
    Table > .table--header { text-style: bold; background: $panel; }
    Table > .table--cursor { background: $accent 60%; text-style: bold; }
    Table:blur > .table--cursor { background: $accent 25%; }
    Table > .table--odd { background: $boost; }
    Table > .table--alarm { color: $error; text-style: bold; }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", show=False), Binding("down", "cursor(1)", show=False),
        Binding("pageup", "page(-1)", show=False), Binding("pagedown", "page(1)", show=False),
        Binding("home", "jump(0)", show=False), Binding("end", "jump(-1)", show=False),
        Binding("enter", "activate", show=False),
    ]

    class Highlighted(Message):
        """The cursor moved to another row."""

    class Activated(Message):
        """Enter (or a double click) on the cursor's row."""

    class HeaderClicked(Message):
        def __init__(self, column: int) -> None:
            super().__init__()
            self.column = column

    def __init__(self, headers: list[str], right: Set[int] = frozenset(), **kwargs) -> None:
        super().__init__(**kwargs)
        self.headers = list(headers)
        self.right = set(right)                      # right-aligned columns (numbers)
        self.keys: list[str] = []
        self.cells: list[tuple[str, ...]] = []
        self.alarm: set[int] = set()                 # rows drawn in the alarm style
        self.cursor = 0
        self.widths = [len(h) for h in headers]

    # ---- content --------------------------------------------------------------------------
    @property
    def row_count(self) -> int:
        return len(self.keys)

    @property
    def selected_key(self) -> str | None:
        return self.keys[self.cursor] if 0 <= self.cursor < len(self.keys) else None

    def show(self, rows: list[tuple[str, tuple[str, ...]]], alarm: Set[int] = frozenset()
             ) -> None:
        """Replace the rows; the cursor stays on the same key where it still exists."""
        selected = self.selected_key
        # Escaped here, where every cell enters, so that widths count what is drawn and a
        # name's ESC or newline reaches no terminal (gpumemctl/protocol/escape.py).
        keys = [key for key, _ in rows]
        cells = [tuple(map(escape, row)) for _, row in rows]
        if keys == self.keys and cells == self.cells and set(alarm) == self.alarm:
            return                                   # nothing to repaint
        self.keys, self.cells, self.alarm = keys, cells, set(alarm)
        widths = [len(h) for h in self.headers]
        for row in self.cells:
            for i, cell in enumerate(row):
                if len(cell) > widths[i]:
                    widths[i] = len(cell)
        widths[0] = min(widths[0], MAX_NAME)
        self.widths = widths
        # One leading space, the columns and the gaps between them (as _line_text lays out).
        self.virtual_size = Size(1 + sum(widths) + GAP * (len(widths) - 1),
                                 len(self.keys) + 1)
        if selected in self.keys:
            self.cursor = self.keys.index(selected)
        self.cursor = max(0, min(self.cursor, len(self.keys) - 1))
        self.refresh()
        if self.selected_key != selected:
            self.post_message(self.Highlighted())

    def set_headers(self, headers: list[str]) -> None:
        self.headers = list(headers)
        self.refresh()

    def move_cursor(self, row: int) -> None:
        row = max(0, min(row, len(self.keys) - 1))
        changed = row != self.cursor
        self.cursor = row
        self.scroll_to_cursor()
        self.refresh()
        if changed:
            self.post_message(self.Highlighted())

    @property
    def visible_rows(self) -> int:
        """Rows on screen below the header: not those behind a horizontal scrollbar (at 80
        columns the table is wider than its panel and one shows)."""
        return max(1, self.scrollable_content_region.height - 1)

    def scroll_to_cursor(self) -> None:
        """Scroll the least that puts the cursor's row on screen. Forced: rows that came
        in the same frame have no scrollbars yet, which would refuse the scroll."""
        top, visible = self.scroll_offset.y, self.visible_rows
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, force=True)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False, force=True)

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        """A scrollbar that comes (or a terminal resize) hides the last row: once the layout
        has settled, scroll again so the cursor stays above it."""
        self.call_after_refresh(self.scroll_to_cursor)

    def on_resize(self) -> None:
        self.call_after_refresh(self.scroll_to_cursor)

    # ---- drawing ----------------------------------------------------------------------
    def _line_text(self, cells) -> str:
        parts = []
        for i, (cell, width) in enumerate(zip(cells, self.widths, strict=False)):
            if len(cell) > width:
                cell = cell[:width - 1] + "…"
            parts.append(cell.rjust(width) if i in self.right else cell.ljust(width))
        return " " + (" " * GAP).join(parts)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        if y == 0:
            text, style = self._line_text(self.headers), \
                self.get_component_rich_style("table--header")
        else:
            row = scroll_y + y - 1
            if row >= len(self.keys):
                return Strip.blank(width, self.rich_style)
            text, style = self._line_text(self.cells[row]), self._row_style(row)
        text = text[scroll_x:scroll_x + width].ljust(width)
        return Strip([Segment(text, style)], width)

    def _row_style(self, row: int) -> Style:
        style = self.rich_style
        if row % 2:
            style += self.get_component_rich_style("table--odd")
        if row in self.alarm:
            style += self.get_component_rich_style("table--alarm")
        if row == self.cursor:
            style += self.get_component_rich_style("table--cursor")
        return style

    # ---- keys and mouse -----------------------------------------------------------------
    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor + direction * self.visible_rows)

    def action_jump(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self.keys) - 1)

    def action_activate(self) -> None:
        if self.selected_key is not None:
            self.post_message(self.Activated())

    def on_click(self, event) -> None:
        if event.y == 0:
            x = event.x + self.scroll_offset.x - 1
            for column, width in enumerate(self.widths):
                if x < width + GAP:
                    self.post_message(self.HeaderClicked(column))
                    return
                x -= width + GAP
            return
        row = self.scroll_offset.y + event.y - 1
        if 0 <= row < len(self.keys):
            self.move_cursor(row)
            if event.chain == 2:
                self.post_message(self.Activated())
