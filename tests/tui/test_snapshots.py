"""The monitor's look, pinned with pytest-textual-snapshot: the main screen with
allocations, the create form showing a validation error, the delete modal, and the
not-running screen. The data comes from a real daemon, frozen (tests/tui/driving.py).
Update after an intended change: pytest tests/tui --snapshot-update, then look at the SVGs."""
from __future__ import annotations

import pytest

from tui import make_app

from .driving import freeze, frozen_app, settled, until

# The pictures were drawn from a daemon of memory and parity of its own per allocation; the
# layout decides the memory and keeper figures shown, not how they are drawn.
pytestmark = [pytest.mark.usefixtures("no_cursor_blink"), pytest.mark.slabs_off]


@pytest.fixture
def no_cursor_blink(monkeypatch):
    from textual.widgets import Input
    monkeypatch.setattr(Input, "cursor_blink", False)


@pytest.fixture
def populated(daemon):
    for name, size, durable in (("models/llama", "64M", True), ("models/mistral", "16M", True),
                                ("scratch/kv", "8M", False), ("scratch/tmp", "2M", False),
                                ("weights", "4M", True)):
        daemon.cli("create", name, "--size", size, *(["--durable"] if durable else []),
                   check=True)
    daemon.cli("create", "plain", "--size", "2M", "--ecc", "none", check=True)
    daemon.cli("verify", "weights", check=True)
    return freeze(daemon)


def test_main_screen_with_allocations(populated, snap_compare):
    assert snap_compare(frozen_app(populated), terminal_size=(120, 36), run_before=settled)


def test_main_screen_at_80x24(populated, snap_compare):
    assert snap_compare(frozen_app(populated), terminal_size=(80, 24), run_before=settled)


def test_create_form_validation_error(populated, snap_compare):
    async def bad_size(pilot):
        await settled(pilot)
        await pilot.press("c")
        await pilot.pause(0.2)
        await pilot.press(*"models/new", "tab", *"12Q", "enter")
        await pilot.pause(0.2)
    assert snap_compare(frozen_app(populated), terminal_size=(120, 36), run_before=bad_size)


def test_delete_modal(populated, snap_compare):
    async def ask(pilot):
        await settled(pilot)
        await pilot.press("down", "down", "down")               # weights, durable
        await until(pilot, lambda: "weights" in str(
            pilot.app.main.query_one("#detail-body").render()), what="the detail")
        await pilot.press("delete")
        await pilot.pause(0.2)
    assert snap_compare(frozen_app(populated), terminal_size=(120, 36), run_before=ask)


def test_not_running_screen(snap_compare, tmp_path):
    app = make_app("/run/gpumemd-test/nonexistent.sock", live=False)
    assert snap_compare(app, terminal_size=(100, 30),
                        run_before=lambda pilot: pilot.pause(0.5))
