"""Shown while gpumemd cannot be reached; the app keeps trying and pops it by itself when
the daemon answers again."""
from __future__ import annotations

from rich.text import Text
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpumemctl.protocol.escape import escape


class NotRunningScreen(Screen):
    def __init__(self, socket_path: str, reason: str, refresh_seconds: float) -> None:
        super().__init__()
        self.socket_path, self.reason, self.attempts = socket_path, reason, 0
        self.refresh_seconds = refresh_seconds      # how often the app tries again

    def compose(self):
        with Center():
            with Vertical(id="down-box"):
                yield Static(Text("gpumemd is not running", style="bold red"),
                             id="down-title")
                yield Static(id="down-reason")
                yield Static(Text.assemble(
                    "Start it with ", ("gpumemd --backend auto", "bold"),
                    " (or ",("systemctl start gpumemd", "bold"), ").\n"
                    "This screen goes away by itself when the daemon answers."),
                    id="down-hint")
                yield Static(id="down-attempts")
        yield Footer()

    def on_mount(self) -> None:
        self.show(self.reason)

    def show(self, reason: str) -> None:
        self.reason = reason.removeprefix("gpumemd is not running: ")
        self.query_one("#down-reason", Static).update(
            Text.assemble("socket ", (escape(self.socket_path), "bold"),
                          f"\n{escape(self.reason)}"))
        self.query_one("#down-attempts", Static).update(
            Text(f"retrying every {self.refresh_seconds:g} s ({self.attempts} "
                 "attempts so far)", style="dim"))

    def attempt_failed(self, reason: str) -> None:
        self.attempts += 1
        self.show(reason)
