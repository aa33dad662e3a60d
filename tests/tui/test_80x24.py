"""`gpumemctl top` at 80x24, the size docs/tui.md promises (issue 27, item 6): the last row
of a scrolling table shows, the footer keeps Quit, Esc leaves the filter and Left/Right move
between the buttons of the delete confirmation. What the operator sees: the rendered screen,
where the focus is, and what the daemon did."""
from __future__ import annotations

import json

from tui.screens.confirm import ConfirmScreen

from .driving import live_app, run_app, screen_text, table_rows, until

SMALL = (80, 24)
ROWS = 30                       # more than the 80x24 table shows: it scrolls


def many(daemon, count: int = ROWS) -> list[str]:
    names = [f"row-{i:02d}" for i in range(count)]
    with daemon.client() as c:
        for name in names:
            c.create(name, 1 << 20)
    return names


def selected(app) -> str | None:
    return app.main.query_one("#alloc-table").selected_key


def exists(daemon, name: str) -> bool:
    proc = daemon.cli("info", name, "--json")
    return proc.returncode == 0 and json.loads(proc.stdout)["path"] == name


def test_end_and_page_down_show_the_selected_row(daemon):
    names = many(daemon)
    app = live_app(daemon)

    def table_text() -> str:        # the panel only: the events panel names rows too
        return screen_text(app, app.main.query_one("#allocations"))

    async def scenario(pilot):
        await until(pilot, lambda: len(table_rows(app)) == ROWS, what="every row")
        await pilot.press("end")
        await until(pilot, lambda: selected(app) == names[-1], what="End to select the last")
        await pilot.pause(0.2)
        assert names[-1] in table_text(), table_text()
        await pilot.press("home")
        await until(pilot, lambda: selected(app) == names[0], what="Home")
        for _ in range(4):              # every page: the selected row is on screen
            await pilot.press("pagedown")
            await pilot.pause(0.2)
            assert selected(app) in table_text(), table_text()
    run_app(app, scenario, size=SMALL)


def test_footer_shows_every_key_down_to_80_columns(daemon):
    many(daemon, 3)
    app = live_app(daemon)

    async def scenario(pilot):
        await until(pilot, lambda: len(table_rows(app)) == 3, what="the rows")
        for size in (SMALL, (100, 30), (120, 36), SMALL):     # and after a resize
            await pilot.resize_terminal(*size)
            await pilot.pause(0.3)
            footer = screen_text(app).splitlines()[-1]
            for key in ("c Create", "x Delete", "s Scrub", "q Quit"):
                assert key in footer, f"{size}: {footer}"
    run_app(app, scenario, size=SMALL)


def test_escape_leaves_the_filter_and_keeps_it(daemon):
    many(daemon, 3)
    with daemon.client() as c:
        c.create("scratch/kv", 1 << 20)
    app = live_app(daemon)

    async def scenario(pilot):
        table = app.main.query_one("#alloc-table")
        panel = app.main.query_one("#allocations")
        await until(pilot, lambda: "scratch/" in table_rows(app), what="the root listing")
        await pilot.press("slash", *"kv")
        await until(pilot, lambda: table_rows(app) == ["scratch/kv"], what="the filter")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.focused is table                      # back in the table
        await pilot.press("o")                           # a binding again, not typed
        await pilot.pause(0.2)
        assert panel.sort_key == "size"
        assert panel.filter_text == "kv"                 # the filter stays (Backspace clears)
        assert table_rows(app) == ["scratch/kv"]
        assert "filter 'kv'" in screen_text(app)
        await pilot.press("backspace")
        await until(pilot, lambda: "scratch/" in table_rows(app), what="the filter cleared")
    run_app(app, scenario, size=SMALL)


def test_left_right_move_between_the_confirmation_buttons(daemon):
    many(daemon, 1)
    app = live_app(daemon)

    def focused() -> str | None:
        return app.focused.id if app.focused is not None else None

    async def scenario(pilot):
        await until(pilot, lambda: selected(app) == "row-00", what="the row")
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the dialog")
        await pilot.pause(0.1)
        assert focused() == "no"                          # Cancel first: the safe answer
        await pilot.press("left")
        assert focused() == "yes"
        await pilot.press("right")
        assert focused() == "no"
        await pilot.press("enter")                        # Cancel: nothing removed
        await until(pilot, lambda: app.screen is app.main, what="the dialog to close")
        assert exists(daemon, "row-00")
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the dialog")
        await pilot.pause(0.1)
        await pilot.press("left", "enter")                # Delete
        await until(pilot, lambda: not exists(daemon, "row-00"), what="the remove")
    run_app(app, scenario, size=SMALL)
