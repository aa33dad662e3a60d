"""Issue 12, section 5: what `gpumemctl verify NAME` finds without --repair is recorded, so the
monitor shows it too (tests/integration/test_cli_output.py covers `info` and `ls -l`): the
row turns to state "degraded" (an alarm row) and the detail panel lists the damaged ranges,
while `gpumemctl top` is already running, without a key pressed."""
from __future__ import annotations

import re

from tests.harness import store_random
from tui.widgets.allocations import AllocationTable
from tui.widgets.detail import DetailPanel, info_lines

from .driving import live_app, run_app, table_rows, until

BLOCK = 128 * 1024
STATE = 5                     # tui/model.COLUMNS: name, size, capacity, device, durable, state


def row_of(app, name: str) -> tuple[int, tuple[str, ...]]:
    table = app.main.query_one("#alloc-table", AllocationTable)
    index = table_rows(app).index(name)
    return index, table.cells[index]


def test_damage_found_by_a_verify_without_repair_shows_in_the_monitor(ecc_daemon):
    d = ecc_daemon
    store_random(d, "a")
    app = live_app(d)
    shown: dict = {}

    async def scenario(pilot):
        await until(pilot, lambda: "a" in table_rows(app), what="row a")
        app.main.query_one("#alloc-table").move_cursor(table_rows(app).index("a"))
        await until(pilot, lambda: app.main.query_one(DetailPanel).shown_path == "a",
                    what="the detail of a")
        assert row_of(app, "a")[1][STATE] == "ready"
        # Damage two blocks, then a verify WITHOUT --repair: exit 8, nothing repaired.
        d.cli("debug", "corrupt", "a", "--offset", "5000", "--length", "100", check=True)
        d.cli("debug", "corrupt", "a", "--offset", str(3 * BLOCK + 77), "--length", "4096",
              check=True)
        d.cli("verify", "a", check=8)

        def detail():
            return app.main.query_one(DetailPanel)._shown or {}

        await until(pilot, lambda: row_of(app, "a")[1][STATE] == "degraded"
                    and detail().get("damaged") == [[0, BLOCK], [3 * BLOCK, 4 * BLOCK]],
                    timeout=20, what="the damage in the table and the detail panel",
                    explain=lambda: f"row {row_of(app, 'a')[1]}, detail {detail()}")
        table = app.main.query_one("#alloc-table", AllocationTable)
        shown["alarm"] = row_of(app, "a")[0] in table.alarm
        shown["text"] = info_lines(detail()).plain

    run_app(app, scenario)
    assert shown["alarm"], "a degraded row is drawn as an alarm"
    assert re.search(r"^state +degraded$", shown["text"], re.MULTILINE), shown["text"]
    assert re.search(r"^damaged +0-131071, 393216-524287$", shown["text"], re.MULTILINE), \
        shown["text"]
