"""Driving `gpumemctl top` in tests (helpers the TUI tests import; the fixtures are in
tests/conftest.py): Pilot against a real daemon (host backend), and a frozen source for
snapshot tests, whose screens must not change with the clock."""
from __future__ import annotations

import asyncio
import copy
import time

from tui import make_app
from tui.model import Snapshot
from tui.source import DaemonSource

SIZE = (120, 36)
FROZEN_NOW = 1_795_000_000.0          # the frozen clock: 2026-11-18T11:06:40Z


def run_app(app, scenario, size=SIZE, timeout: float = 60.0):
    """Run `await scenario(pilot)` inside the app, headless; returns its result."""
    async def main():
        async with app.run_test(size=size) as pilot:
            return await asyncio.wait_for(scenario(pilot), timeout)
    return asyncio.run(main())


async def until(pilot, predicate, timeout: float = 10.0, what: str = "the screen",
                explain=None):
    """Poll `predicate` between frames; on timeout the error says what was still missing
    (`explain()`, where given), so a failure on a loaded CI machine can be read."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if predicate():
            return
    missing = f": {explain()}" if explain else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{missing}")


def table_rows(app) -> list[str]:
    """The NAME column of the allocation table, top to bottom."""
    return [cells[0] for cells in app.main.query_one("#alloc-table").cells]


def screen_text(app, widget=None) -> str:
    """The active screen as its characters, one line per row: what the terminal shows (a
    row hidden behind a scrollbar or a key cut off the footer is not in it). With `widget`,
    only the part of the screen that widget covers."""
    lines = [strip.text for strip in app.screen._compositor.render_strips()]
    if widget is None:
        return "\n".join(lines)
    r = widget.region
    return "\n".join(line[r.x:r.right] for line in lines[r.y:r.bottom])


def notifications(app) -> list[str]:
    return [n.message for n in app._notifications]


def live_app(daemon, **kw):
    """An app on a test daemon, refreshing quickly."""
    return make_app(daemon.socket, refresh_seconds=kw.pop("refresh_seconds", 0.3), **kw)


class FrozenSource(DaemonSource):
    """Serves one snapshot, taken from a real daemon and then frozen (times, pids, uuids
    fixed), so a snapshot test's picture depends only on the code that draws it."""

    def __init__(self, snapshot: Snapshot, events: list[dict]):
        super().__init__("/run/gpumemd/gpumemd.sock")
        self.frozen, self.events = snapshot, events

    def snapshot(self) -> Snapshot:
        return self.frozen

    def subscribe(self, since, backlog=100):
        yield from ({"type": "event", "event": e} for e in self.events)

    def info(self, path):
        return self.frozen.by_path[path]


def freeze(daemon, events: int = 8) -> FrozenSource:
    """A real daemon's snapshot, with everything that varies between runs made fixed."""
    with daemon.client() as c:
        status, entries = c.status(), c.ls("", recursive=True)
        log = c.events(since=0, limit=1000)[-events:]
    status = copy.deepcopy(status)
    status["daemon"].update(pid=4242, uptime_s=3725.0, socket="/run/gpumemd/gpumemd.sock",
                            state_dir="/var/lib/gpumemd")
    status["keeper"].update(pid=4243, socket="/var/lib/gpumemd/keeper.sock")
    uuid = "HOST-00000000-0000-4000-8000-000000000000"
    for d in status["devices"]:
        d.update(uuid=uuid, total=8 << 30, free=(8 << 30) - d["ours"])
    stamp = "2026-11-18T08:20:00.000000Z"
    for e in entries:
        e.update(created=stamp, modified=stamp, changed=stamp)
        if e["type"] == "allocation":
            e["device"] = uuid
            if e.get("verified"):
                e["verified"] = "2026-11-18T11:05:10.000000Z"      # 90 s before now
    for i, e in enumerate(log):
        e.update(time_ns=int((FROZEN_NOW - 60 + i) * 1e9), pid=None)
        if "device" in e["detail"]:
            e["detail"]["device"] = uuid
    snap = Snapshot(status, entries, fetched_ms=3.0, taken_at=FROZEN_NOW)
    return FrozenSource(snap, log)


def frozen_app(source: FrozenSource):
    return make_app(source=source, live=False, clock=lambda: FROZEN_NOW)


async def settled(pilot) -> None:
    """Wait until a frozen app has drawn everything its workers bring: the snapshot, the
    detail of the selected row and every event. A screenshot taken earlier, or a dialog
    opened earlier (the screen below a modal is not repainted), would depend on timing."""
    from tui.widgets.detail import DetailPanel
    from tui.widgets.events import EventsPanel
    app = pilot.app
    last = app.source.events[-1]["id"] if app.source.events else 0

    def missing() -> list[str]:
        main = app.main
        if not main.ready:
            return ["the main screen"]
        gaps = []
        if app.snapshot is None:
            gaps.append("the snapshot")
        if main.query_one(DetailPanel)._shown is None:
            gaps.append("the selected row's detail")
        shown = main.query_one(EventsPanel).last_id
        if shown != last:
            gaps.append(f"events up to id {last} (shown up to {shown})")
        return gaps

    # The timeout is generous: the first app of a run loads Textual's CSS and themes, and
    # the 2-core CI machine may be busy with the daemons of the tests before it.
    await until(pilot, lambda: not missing(), timeout=30.0, what="the frozen app to settle",
                explain=lambda: ", ".join(missing()))
    await pilot.pause(0.1)
