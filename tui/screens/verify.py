"""Progress of a verify or recover: a bar over all the bytes to check, the allocation
being checked and the rate. Escape hides it; the work goes on and its result still
arrives as a notification."""
from __future__ import annotations

import time

from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import ProgressBar, Static

from gpumemctl.protocol import format_size
from gpumemctl.protocol.escape import escape
from gpumemctl.protocol.replies import VerifyProgress

from ..model import rate_text


class VerifyScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "hide", "Hide (keeps running)")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title
        self.started = time.monotonic()
        self.progress: VerifyProgress | None = None    # the latest progress frame

    def compose(self):
        with Vertical(id="dialog", classes="verify"):
            yield Static(Text(escape(self.title_text)), classes="dialog-title")  # names a path
            yield ProgressBar(total=None, show_eta=False, id="verify-bar")
            yield Static("starting…", id="verify-status")

    def show(self, p: VerifyProgress) -> None:
        self.progress = p
        total, done = p.get("total_bytes") or 0, p.get("done_bytes") or 0
        self.query_one("#verify-bar", ProgressBar).update(total=max(total, 1), progress=done)
        rate = done / max(time.monotonic() - self.started, 1e-6)
        count = p.get("allocations", 0)
        current = min(p.get("allocations_done", 0) + 1, count)
        self.query_one("#verify-status", Static).update(Text(
            f"{escape(p.get('path') or '')}\nallocation {current} of {count}, {format_size(done)} "
            f"of {format_size(total)} at {rate_text(rate)}"))

    def action_hide(self) -> None:
        self.dismiss(None)
