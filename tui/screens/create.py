"""The create form: name, size, mode, device, durability and ECC, checked before anything
is sent (the same parsers as the CLI), with the error shown under the form."""
from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from gpumemctl.formats import parse_mode
from gpumemctl.protocol import GpumemError, normalize, parse_size
from gpumemctl.protocol.defaults import FILE_MODE
from gpumemctl.protocol.escape import escape


def validate(name: str, size: str, mode: str, device: str) -> tuple[dict | None, str, str]:
    """(request, "", "") when valid, else (None, field id, message)."""
    try:
        path = normalize(name)
    except GpumemError as exc:
        return None, "name", str(exc)
    if not size.strip():
        return None, "size", "size is required, e.g. 64M, 1.5G, 2GB or 4096"
    try:
        nbytes = parse_size(size.strip())
    except GpumemError as exc:
        return None, "size", str(exc)
    try:
        bits = parse_mode(mode)
    except GpumemError as exc:
        return None, "mode", str(exc)
    request = {"path": path, "size": nbytes, "mode": bits,
               "device": device.strip() or None}
    return request, "", ""


class CreateScreen(ModalScreen[dict | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, directory: str = "") -> None:
        super().__init__()
        self.directory = directory

    def compose(self):
        with Vertical(id="dialog", classes="create"):
            yield Static("Create an allocation", classes="dialog-title")
            yield Static("", id="form-error")     # on top: visible at 80x24 too
            with Horizontal(classes="field"):
                yield Label("name", classes="field-label")
                yield Input(value=self.directory + "/" if self.directory else "",
                            placeholder="models/llama", id="name",
                            select_on_focus=False)      # type after the directory
            with Horizontal(classes="field"):
                yield Label("size", classes="field-label")
                yield Input(placeholder="64M, 1.5G, 2GB, 4096", id="size")
            with Horizontal(classes="field"):
                yield Label("mode", classes="field-label")
                yield Input(value=f"{FILE_MODE:04o}", id="mode")
            with Horizontal(classes="field"):
                yield Label("device", classes="field-label")
                yield Input(placeholder="index or UUID (default: the daemon's choice)",
                            id="device")
            with Horizontal(classes="field"):
                yield Label("ecc", classes="field-label")
                yield Select([("rs: Reed-Solomon parity", "rs"), ("none", "none")],
                             value="rs", allow_blank=False, id="ecc")
            yield Checkbox("durable: survives client and daemon crashes", id="durable")
            with Horizontal(classes="buttons"):
                yield Button("Create", variant="primary", id="create")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#name", Input).focus()

    def _value(self, field: str) -> str:
        return self.query_one(f"#{field}", Input).value

    def submit(self) -> None:
        request, field, message = validate(self._value("name"), self._value("size"),
                                           self._value("mode"), self._value("device"))
        for name in ("name", "size", "mode", "device"):
            self.query_one(f"#{name}", Input).set_class(name == field, "-invalid")
        error = self.query_one("#form-error", Static)
        if request is None:
            error.update(Text(escape(message)))     # it quotes the name as typed
            self.query_one(f"#{field}", Input).focus()
            return
        error.update("")
        request["durable"] = self.query_one("#durable", Checkbox).value
        request["ecc"] = self.query_one("#ecc", Select).value
        self.dismiss(request)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "create":
            self.submit()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
