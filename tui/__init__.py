"""`gpumemctl top`: the Textual monitor (docs/tui.md). Imported only by that command, so the
rest of the CLI never loads Textual."""
from .app import GpumemApp, make_app

__all__ = ["GpumemApp", "make_app"]
