"""The `gpumemctl top` application: state, workers and actions.

Workers (threads) talk to the daemon through a `DaemonSource` and only post messages; the
handlers here own every change of state, so nothing draws while a call is in flight and a
failed action becomes a notification, never a crash. `make_app()` is the one factory, used
by `gpumemctl top` and by the tests.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.text import Text
from textual import work
from textual.app import App
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.notifications import SeverityLevel

from gpumemctl.formats import duration
from gpumemctl.protocol import GpumemError, NotRunning, format_size
from gpumemctl.protocol.escape import escape
from gpumemctl.protocol.replies import Event, Node
from gpumemctl.protocol.replies import VerifyProgress as ProgressFrame

from .messages import (
    ActionDone,
    ActionFailed,
    DaemonDown,
    DetailReady,
    EventArrived,
    NodesChanged,
    SnapshotReady,
    VerifyFinished,
    VerifyProgress,
)
from .model import Snapshot
from .screens.confirm import ConfirmScreen
from .screens.create import CreateScreen
from .screens.main import Banner, MainScreen
from .screens.not_running import NotRunningScreen
from .screens.verify import VerifyScreen
from .source import DaemonSource
from .widgets.allocations import AllocationsPanel
from .widgets.detail import DetailPanel
from .widgets.devices import DevicesPanel
from .widgets.events import EventsPanel
from .widgets.scrub import ScrubPanel

log = logging.getLogger("gpumemctl.top")

# Actions that act on the main screen; disabled while a dialog or the not-running screen
# is up, so a stray key never fires one behind a dialog.
MAIN_ACTIONS = {"create", "durable", "transient", "verify", "verify_all", "recover",
                "delete", "scrub"}
EVENT_BACKLOG = 50          # events shown at start
SOON = 0.05                 # a change notice asks for a snapshot this much later


def drawing(handler):
    """A handler that draws into the main screen's panels. While the app shuts down the
    panels go before the screen does, and a snapshot or event may still arrive: drop it."""
    @functools.wraps(handler)
    def guarded(self, *args, **kwargs):
        try:
            return handler(self, *args, **kwargs)
        except NoMatches:
            if self.is_running and self.main.is_attached and self.main.ready and \
                    self.main.children:
                raise                   # not a shutdown: a real bug
    return guarded


class GpumemApp(App):
    TITLE = "gpumemctl top"
    CSS_PATH = ["styles/main.tcss", "styles/dialogs.tcss"]
    BINDINGS = [
        Binding("c", "create", "Create"),
        Binding("d", "durable", "Durable"),
        Binding("t", "transient", "Transient"),
        Binding("v", "verify", "Verify"),
        Binding("V", "verify_all", "Verify all", show=False),
        Binding("r", "recover", "Recover"),
        Binding("x,delete", "delete", "Delete"),     # the footer shows the first: "x"
        Binding("s", "scrub", "Scrub"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: DaemonSource, *, refresh_seconds: float = 1.0,
                 clock: Callable[[], float] = time.time, live: bool = True) -> None:
        super().__init__()
        self.source = source
        self.refresh_seconds = refresh_seconds
        self.clock = clock              # ages ("3m ago") are relative to it
        self.live = live                # False: one snapshot, no timer (snapshot tests)
        self.snapshot: Snapshot | None = None
        self.main = MainScreen()
        self._fetching = self._fetch_again = self._soon = False
        self._down: NotRunningScreen | None = None
        self._verify: VerifyScreen | None = None
        self._detail: Node | None = None
        self._last_event = 0            # the newest event id seen (resubscribe after it)
        self.verify_frames: list[ProgressFrame] = []   # progress of the last verify/recover
        self._unshown: list[Event] = []  # events that came before the panel existed

    def get_default_screen(self) -> MainScreen:
        return self.main

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Every notification, escaped and without markup: most quote a name or a daemon
        message, which may hold an ESC, a newline or "[" (gpumemctl/protocol/escape.py)."""
        super().notify(escape(message), title=escape(title), severity=severity,
                       timeout=timeout, markup=False)

    def on_mount(self) -> None:
        self.request_snapshot()
        if self.live:
            self.set_interval(self.refresh_seconds, self.request_snapshot)
        self._watch()

    def on_unmount(self) -> None:
        self.source.close()             # unblocks the workers' sockets

    def check_action(self, action: str, parameters) -> bool | None:
        if action in MAIN_ACTIONS and self.screen is not self.main:
            return None                 # shown disabled, does nothing
        return True

    # ---- snapshots ----------------------------------------------------------------------
    def request_snapshot(self) -> None:
        if self._fetching:
            self._fetch_again = True
            return
        self._fetching = True
        self._fetch()

    def request_soon(self) -> None:
        """Coalesce a burst of change notices into one snapshot."""
        if not self._soon:
            self._soon = True
            self.set_timer(SOON, self._soon_due)

    def _soon_due(self) -> None:
        self._soon = False
        self.request_snapshot()

    @work(thread=True, exit_on_error=False, group="snapshot")
    def _fetch(self) -> None:
        try:
            snapshot = self.source.snapshot()
        except NotRunning as exc:
            self.post_message(DaemonDown(str(exc)))
            return
        except Exception as exc:  # a bug must not take the monitor down
            log.exception("snapshot failed")
            self.post_message(DaemonDown(f"snapshot failed: {type(exc).__name__}: {exc}"))
            return
        self.post_message(SnapshotReady(snapshot))

    def _fetched(self) -> None:
        self._fetching = False
        if self._fetch_again:
            self._fetch_again = False
            self.request_snapshot()

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._fetched()
        if self._down is not None:
            down, self._down = self._down, None
            if self.screen is down:
                self.pop_screen()
            self.notify("gpumemd is back", title="reconnected")
        self.snapshot = message.snapshot
        self.draw(message.snapshot)

    @drawing
    def draw(self, snap: Snapshot) -> None:
        main = self.main
        if not main.ready:
            return                      # MainScreen.on_mount draws it
        main.query_one(DevicesPanel).show(snap.devices)
        allocations = main.query_one(AllocationsPanel)
        allocations.show(snap, self.clock())
        main.query_one(ScrubPanel).show(snap.scrub)
        main.query_one(Banner).show(banner(snap))
        self._show_events()
        self._follow_selection(allocations.selected_entry)

    def _follow_selection(self, entry: Node | None) -> None:
        """The detail follows the table's selection. The panel's Selected message brings
        it; every draw checks as well, because that message was seen lost (a CI run, about
        one start in 50) when it was posted while the screen was still mounting."""
        if entry is not None and self.main.query_one(DetailPanel).shown_path != entry["path"]:
            self.on_allocations_panel_selected(AllocationsPanel.Selected(entry))

    @drawing
    def _show_events(self) -> None:
        panel = self.main.query_one(EventsPanel)
        for event in self._unshown:
            panel.add(event)
        self._unshown.clear()

    def on_daemon_down(self, message: DaemonDown) -> None:
        self._fetched()
        if self._down is None:
            self._down = NotRunningScreen(self.source.socket_path, message.reason,
                                          self.refresh_seconds)
            self.push_screen(self._down)
        else:
            self._down.attempt_failed(message.reason)

    # ---- the subscription: events and change notices -------------------------------------
    @work(thread=True, exit_on_error=False, group="subscription")
    def _watch(self) -> None:
        while not self.source.closed:
            try:
                since = self._last_event or None
                for item in self.source.subscribe(since, EVENT_BACKLOG):
                    if item["type"] == "event":
                        self.post_message(EventArrived(item["event"]))
                    else:
                        self.post_message(NodesChanged(item.get("paths", [])))
            except NotRunning:
                pass                        # the snapshot worker shows the down screen
            except Exception:  # keep watching; the log has the bug
                log.exception("event subscription failed")
            time.sleep(self.refresh_seconds)

    def on_event_arrived(self, message: EventArrived) -> None:
        self._last_event = max(self._last_event, message.event["id"])
        self._unshown.append(message.event)
        if self.main.ready:
            self._show_events()
        self.request_soon()

    def on_nodes_changed(self, message: NodesChanged) -> None:
        self.request_soon()

    # ---- detail -------------------------------------------------------------------------
    @drawing
    def on_allocations_panel_selected(self, message: AllocationsPanel.Selected) -> None:
        entry = message.entry
        if entry is None:
            self._detail = None
            self.main.query_one(DetailPanel).show(None)
            return
        keep: Mapping[str, Any] = self._detail \
            if self._detail and self._detail["path"] == entry["path"] else {}
        self.main.query_one(DetailPanel).show({**entry, **{k: v for k, v in keep.items()
                                                            if k not in entry}})
        self._fetch_detail(entry["path"])

    @work(thread=True, exit_on_error=False, group="detail", exclusive=True)
    def _fetch_detail(self, path: str) -> None:
        try:
            self.post_message(DetailReady(self.source.info(path)))
        except (GpumemError, OSError):
            pass                        # gone meanwhile; the next snapshot shows it

    @drawing
    def on_detail_ready(self, message: DetailReady) -> None:
        selected = self.main.query_one(AllocationsPanel).selected_entry
        if selected is not None and selected["path"] == message.info["path"]:
            self._detail = message.info
            self.main.query_one(DetailPanel).show(message.info)

    # ---- actions ------------------------------------------------------------------------
    def _selected(self, want_allocation: bool = False) -> Node | None:
        entry = self.main.query_one(AllocationsPanel).selected_entry
        if entry is None or (want_allocation and entry["type"] != "allocation"):
            self.notify("select an allocation first" if want_allocation
                        else "select an entry first", severity="warning")
            return None
        return entry

    def run_call(self, done: Callable[[Any], str], method: str, *args, **kwargs) -> None:
        """Run `Client.<method>` on a worker; its result or error becomes a notification."""
        self._call(done, method, args, kwargs)

    @work(thread=True, exit_on_error=False, group="actions")
    def _call(self, done, method: str, args: tuple, kwargs: dict) -> None:
        try:
            result = self.source.call(method, *args, **kwargs)
        except GpumemError as exc:
            self.post_message(ActionFailed(str(exc)))
            return
        except Exception as exc:  # a failed action never crashes the app
            log.exception("action %s failed", method)
            self.post_message(ActionFailed(f"{method} failed: {type(exc).__name__}: {exc}"))
            return
        self.post_message(ActionDone(done(result)))

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text)
        self.request_snapshot()

    def on_action_failed(self, message: ActionFailed) -> None:
        self.notify(message.text, title="failed", severity="error", timeout=10)
        self.request_snapshot()

    def action_create(self) -> None:
        cwd = self.main.query_one(AllocationsPanel).cwd
        self.push_screen(CreateScreen(cwd), self._create)

    def _create(self, request: dict | None) -> None:
        if request is None:
            return
        self.run_call(lambda info: f"created {info['path']}: {format_size(info['size'])} "
                                   f"({'durable' if info['durable'] else 'transient'})",
                      "create", request["path"], request["size"], durable=request["durable"],
                      mode=request["mode"], device=request["device"], ecc=request["ecc"])

    def action_durable(self) -> None:
        self._set_durable(True)

    def action_transient(self) -> None:
        self._set_durable(False)

    def _set_durable(self, durable: bool) -> None:
        entry = self._selected(want_allocation=True)
        if entry is not None:
            word = "durable" if durable else "transient"
            self.run_call(lambda _: f"{entry['path']} is {word}", "set_durable",
                          entry["path"], durable)

    def action_delete(self) -> None:
        entry = self._selected()
        if entry is None:
            return
        if entry["type"] == "directory":
            question = (f"Remove the directory {entry['path']} and everything below it "
                        f"({entry['entries']} entries directly inside)?")
        elif entry["type"] == "allocation":
            question = (f"Free {entry['path']} ({format_size(entry['size'])}, "
                        f"{'durable' if entry['durable'] else 'transient'})? "
                        "Its data is gone for good.")
        else:                           # a link or special file: a name, no memory
            question = f"Remove the {entry['type']} {entry['path']}?"

        def answered(yes: bool | None) -> None:
            if yes:
                self.run_call(lambda removed: f"removed {len(removed)}: {entry['path']}",
                              "remove", entry["path"],
                              recursive=entry["type"] == "directory")
        self.push_screen(ConfirmScreen("Delete", question), answered)

    def action_scrub(self) -> None:
        running = self.snapshot is not None and self.snapshot.scrub.get("state") == "running"
        if running:
            self.run_call(lambda _: "scrub stopping", "scrub", "stop")
        else:
            self.run_call(lambda st: f"scrub started: {format_size(st.get('to_scrub', 0))}",
                          "scrub", "start")

    # ---- verify and recover (with progress) ---------------------------------------------
    def action_verify(self) -> None:
        entry = self._selected()
        if entry is not None:
            self._long(f"Verify {entry['path']}", "verify", [entry["path"]])

    def action_verify_all(self) -> None:
        self._long("Verify all allocations", "verify", [], all=True)

    def action_recover(self) -> None:
        entry = self._selected(want_allocation=True)
        if entry is not None:
            self._long(f"Recover {entry['path']}", "recover", entry["path"])

    def _long(self, title: str, method: str, *args, **kwargs) -> None:
        self.verify_frames = []
        self._verify = VerifyScreen(title)
        self.push_screen(self._verify)
        self._verify_worker(title, method, args, kwargs)

    @work(thread=True, exit_on_error=False, group="verify")
    def _verify_worker(self, title: str, method: str, args: tuple, kwargs: dict) -> None:
        def progress(p: ProgressFrame) -> None:
            self.post_message(VerifyProgress(p))
        try:
            result = self.source.call(method, *args, progress=progress, **kwargs)
        except GpumemError as exc:
            self.post_message(VerifyFinished(title, None, str(exc)))
            return
        except Exception as exc:
            log.exception("%s failed", method)
            self.post_message(VerifyFinished(title, None, f"{type(exc).__name__}: {exc}"))
            return
        summary = result.get("summary") or summary_of(result.get("allocation", {}))
        self.post_message(VerifyFinished(title, summary))

    def on_verify_progress(self, message: VerifyProgress) -> None:
        self.verify_frames.append(message.progress)
        if self._verify is not None and self.screen is self._verify:
            self._verify.show(message.progress)

    def on_verify_finished(self, message: VerifyFinished) -> None:
        if self._verify is not None and self.screen is self._verify:
            self.pop_screen()
        self._verify = None
        if message.error is not None or message.summary is None:
            self.notify(message.error or "no summary", title=message.title, severity="error",
                        timeout=10)
        else:
            text, severity = verify_text(message.summary)
            self.notify(text, title=message.title, severity=severity, timeout=10)
        self.request_snapshot()


def summary_of(result: dict) -> dict:
    """recover answers one allocation's totals; shape them like verify's summary."""
    keys = ("blocks", "clean", "corrected", "uncorrectable", "skipped")
    out = {k: result.get(k, 0) for k in keys}
    out["unrepaired"] = len(result.get("damaged", []))
    out["allocations"] = 1
    return out


def verify_text(s: dict) -> tuple[str, SeverityLevel]:
    counts = (f"{s.get('allocations', 0)} allocation(s), {s.get('blocks', 0)} blocks: "
              f"{s.get('clean', 0)} clean, {s.get('corrected', 0)} repaired, "
              f"{s.get('uncorrectable', 0)} uncorrectable, {s.get('skipped', 0)} skipped")
    if s.get("uncorrectable") or s.get("unrepaired"):
        return "damage left: " + counts, "error"
    if s.get("corrected"):
        return "repaired: " + counts, "warning"
    return "clean: " + counts, "information"


def banner(snap: Snapshot) -> Text:
    d, t, k = snap.status.get("daemon", {}), snap.status.get("totals", {}), \
        snap.status.get("keeper", {})
    keeper = (f"keeper {'alive' if k.get('alive') else 'DOWN'} {k.get('fds', 0)} fds"
              if k else "keeper ?")
    return Text.assemble(
        (f"gpumemd {d.get('version', '?')}   ", "bold"),
        f"{d.get('backend', '?')} backend  pid {d.get('pid', '?')}  up "
        f"{duration(d.get('uptime_s'), '?')}  ",
        (f"{t.get('allocations', 0)} allocations ", "bold"),
        f"({t.get('durable', 0)} durable) {format_size(t.get('capacity', 0))}  "
        f"{t.get('holders', 0)} holders  {keeper}  refresh {snap.fetched_ms:.0f} ms")


def make_app(socket_path: str | None = None, *, source: DaemonSource | None = None,
             **kwargs) -> GpumemApp:
    """The one factory: `gpumemctl top` and the tests build the app here."""
    return GpumemApp(source or DaemonSource(socket_path), **kwargs)
