"""`gpumemctl top` driven with Pilot against a real gpumemd (host backend): what an
operator sees and what each key does to the daemon, checked through the CLI."""
from __future__ import annotations

import json

import pytest

from tui.screens.confirm import ConfirmScreen
from tui.screens.create import CreateScreen
from tui.screens.not_running import NotRunningScreen
from tui.screens.verify import VerifyScreen

from .driving import live_app, notifications, run_app, table_rows, until

MiB = 1 << 20


def make(d, name, size="4M", *flags):
    d.cli("create", name, "--size", size, *flags, check=True)


def info(d, name):
    proc = d.cli("info", name, "--json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


async def select(pilot, app, name: str) -> None:
    """Put the table's cursor on the row called `name`."""
    await until(pilot, lambda: name in table_rows(app), what=f"row {name}")
    app.main.query_one("#alloc-table").move_cursor(table_rows(app).index(name))
    await pilot.pause(0.1)


def test_lists_navigates_filters_and_sorts(daemon):
    make(daemon, "models/llama", "64M", "--durable")
    make(daemon, "models/mistral", "16M")
    make(daemon, "scratch/kv", "8M")
    make(daemon, "weights", "32M")
    app = live_app(daemon)

    async def scenario(pilot):
        await until(pilot, lambda: table_rows(app) == ["models/", "scratch/", "weights"],
                    what="the root listing")
        await select(pilot, app, "models/")
        await pilot.press("enter")                          # into the directory
        await until(pilot, lambda: table_rows(app) == ["llama", "mistral"])
        await pilot.press("o")                              # sort by size, ascending
        await until(pilot, lambda: table_rows(app) == ["mistral", "llama"])
        await pilot.press("O")                              # reversed
        await until(pilot, lambda: table_rows(app) == ["llama", "mistral"])
        await pilot.press("backspace")                      # back up
        await until(pilot, lambda: "scratch/" in table_rows(app))
        await pilot.press("slash", *"kv")                   # filter below the root
        await until(pilot, lambda: table_rows(app) == ["scratch/kv"])
        await pilot.press("escape", "enter")                # back to the table
        await select(pilot, app, "scratch/kv")
        detail = str(app.main.query_one("#detail-body").render())
        assert "scratch/kv" in detail and "8M (8388608)" in detail
    run_app(app, scenario)


def test_live_updates_from_the_cli_and_holders(daemon):
    app = live_app(daemon, refresh_seconds=30)      # only the subscription can make it show at once

    async def scenario(pilot):
        await until(pilot, lambda: app.snapshot is not None, what="the first snapshot")
        make(daemon, "late", "2M")
        await until(pilot, lambda: "late" in table_rows(app), timeout=5,
                    what="a create from the CLI to show")
        events = app.main.query_one("#events")
        assert any("create" in str(line.text) and "late" in str(line.text)
                   for line in events.lines)
        with daemon.client() as c, c.open("late", "r"):
            await until(pilot, lambda: app.snapshot.by_path["late"]["refcount"] == 1,
                        timeout=5, what="the reader to show as a holder")
    run_app(app, scenario)


def test_create_form_creates_and_rejects_bad_input(daemon):
    app = live_app(daemon)

    async def scenario(pilot):
        await until(pilot, lambda: app.snapshot is not None)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CreateScreen))
        await pilot.press(*"new/thing", "tab", *"1.5Q", "enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, CreateScreen)          # still open
        assert "invalid size '1.5Q'" in str(app.screen.query_one("#form-error").render())
        assert app.screen.query_one("#size").has_class("-invalid")
        size = app.screen.query_one("#size")
        size.value = "3M"
        app.screen.query_one("#durable").value = True
        await pilot.click("#create")
        await until(pilot, lambda: not isinstance(app.screen, CreateScreen))
        await until(pilot, lambda: info(daemon, "new/thing") is not None, what="the create")
        await until(pilot, lambda: any("created new/thing" in n for n in notifications(app)))
    run_app(app, scenario)
    got = info(daemon, "new/thing")
    assert got["size"] == 3 * MiB and got["durable"] is True and got["mode"] == "0600"


def test_durable_and_transient_keys(daemon):
    make(daemon, "a", "2M")
    app = live_app(daemon)

    async def scenario(pilot):
        await select(pilot, app, "a")
        await pilot.press("d")
        await until(pilot, lambda: info(daemon, "a")["durable"] is True, what="durable")
        await pilot.press("t")
        await until(pilot, lambda: info(daemon, "a")["durable"] is False, what="transient")
    run_app(app, scenario)


def test_delete_asks_first(daemon):
    make(daemon, "keep", "2M", "--durable")
    make(daemon, "dir/inner", "2M")
    app = live_app(daemon)

    async def scenario(pilot):
        await select(pilot, app, "keep")
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")                                    # no: nothing happens
        await pilot.pause(0.3)
        assert info(daemon, "keep") is not None
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: info(daemon, "keep") is None, what="the remove")
        await until(pilot, lambda: "keep" not in table_rows(app))
        await select(pilot, app, "dir/")                         # a directory: recursive
        await pilot.press("delete")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.click("#yes")
        await until(pilot, lambda: info(daemon, "dir") is None, what="the directory remove")
    run_app(app, scenario)


def test_failed_actions_notify_and_the_app_survives(daemon):
    make(daemon, "taken", "2M")
    app = live_app(daemon)

    async def scenario(pilot):
        await select(pilot, app, "taken")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, CreateScreen))
        await pilot.press(*"taken", "tab", *"2M", "enter")       # exists
        await until(pilot, lambda: any("exists" in n for n in notifications(app)),
                    what="the 'exists' notification")
        daemon.cli("rm", "taken", check=True)
        await pilot.press("d")                                    # gone meanwhile
        await until(pilot, lambda: any("taken" in n and "no such" in n.lower()
                                       for n in notifications(app)) or
                    "taken" not in table_rows(app), what="a not-found notice or refresh")
        assert app.is_running
    run_app(app, scenario)


@pytest.fixture
def ecc_daemon(daemon_factory):
    d = daemon_factory(extra_args=["--enable-fault-injection", "--host-capacity", "512M"])
    d.allow_errors = True
    return d


def test_verify_with_progress_then_recover(ecc_daemon):
    d = ecc_daemon
    make(d, "big", "256M", "--durable")
    d.cli("write", "big", input=b"\x5a" * (256 * MiB), check=True)
    app = live_app(d)
    seen: list[dict] = []

    async def scenario(pilot):
        await select(pilot, app, "big")
        await pilot.press("v")
        await until(pilot, lambda: any(n.startswith("clean:") for n in notifications(app)),
                    timeout=60, what="the verify result")
        assert not isinstance(app.screen, VerifyScreen)          # the dialog went away
        seen.extend(app.verify_frames)
        await until(pilot, lambda: app.snapshot.by_path["big"]["verified"] is not None)
        d.cli("debug", "corrupt", "big", "--offset", "1000", "--length", "3", check=True)
        await pilot.press("r")
        await until(pilot, lambda: any(n.startswith("repaired:") for n in
                                       notifications(app)), timeout=60,
                    what="the recover result")
        assert app.verify_frames and app.verify_frames[0]["path"] == "big"
    run_app(app, scenario)
    # The dialog was fed the daemon's progress frames: from 0 to all 256 MiB of "big".
    assert seen[0]["done_bytes"] == 0 and seen[0]["total_bytes"] == 256 * MiB
    assert all(f["path"] == "big" for f in seen)
    done = [f["done_bytes"] for f in seen]
    assert done == sorted(done)
    assert d.cli("read", "big", "--length", "4096", check=True).stdout == b"\x5a" * 4096


def test_scrub_start_and_stop(ecc_daemon):
    d = ecc_daemon
    make(d, "s1", "256M")
    app = live_app(d)

    async def scenario(pilot):
        await until(pilot, lambda: app.snapshot is not None)
        await pilot.press("s")
        await until(pilot, lambda: app.snapshot.scrub.get("state") == "running",
                    what="the scrub to run")
        assert "running" in str(app.main.query_one("#scrub-state").render())
        await pilot.press("s")
        await until(pilot, lambda: app.snapshot.scrub.get("state") == "idle", timeout=15,
                    what="the scrub to stop")
    run_app(app, scenario)
    last = d.cli_json("scrub", "status")["last"]
    assert last["stopped"] is True


def test_not_running_screen_then_reconnect(daemon):
    make(daemon, "durable-one", "2M", "--durable")
    app = live_app(daemon, refresh_seconds=0.2)

    async def scenario(pilot):
        await until(pilot, lambda: "durable-one" in table_rows(app))
        daemon.stop()
        await until(pilot, lambda: isinstance(app.screen, NotRunningScreen), timeout=5,
                    what="the not-running screen")
        await pilot.press("c")                       # actions do nothing meanwhile
        assert isinstance(app.screen, NotRunningScreen)
        daemon.start()
        await until(pilot, lambda: app.screen is app.main, timeout=10,
                    what="the main screen to come back")
        await until(pilot, lambda: "durable-one" in table_rows(app))
    run_app(app, scenario)
