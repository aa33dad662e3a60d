"""A yes/no modal, used before anything that destroys data (delete)."""
from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gpumemctl.protocol.escape import escape


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape,n", "answer(False)", "Cancel"),
                Binding("y", "answer(True)", "Yes"),
                Binding("left", "move(-1)", show=False),
                Binding("right", "move(1)", show=False)]

    def __init__(self, title: str, question: str, yes: str = "Delete") -> None:
        super().__init__()
        self.title_text, self.question, self.yes = title, question, yes

    def compose(self):
        with Vertical(id="dialog", classes="confirm"):
            # Text, not markup: the question quotes a name, which may hold "[" or an ESC.
            yield Static(Text(escape(self.title_text)), classes="dialog-title")
            yield Static(Text(escape(self.question)), id="question")
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button("Cancel", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()          # the safe answer is the default

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def action_move(self, step: int) -> None:
        """Left/Right: the focus to the button beside the focused one (Enter presses it);
        it stops at either end rather than wrapping."""
        buttons = list(self.query(Button))
        at = buttons.index(self.focused) if self.focused in buttons else len(buttons) - 1
        buttons[max(0, min(at + step, len(buttons) - 1))].focus()
