"""The scrub panel: a progress bar with rate and ETA while a scrub runs; the last result
otherwise (the numbers of `gpumemctl scrub status`)."""
from __future__ import annotations

import datetime
from collections.abc import Mapping

from rich.text import Text
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from gpumemctl.formats import duration
from gpumemctl.protocol import format_size
from gpumemctl.protocol.replies import ScrubLast, ScrubSummary

from ..model import rate_text


def _counts(t: Mapping[str, object]) -> str:
    return (f"{t.get('corrected', 0)} repaired, {t.get('uncorrectable', 0)} uncorrectable, "
            f"{t.get('skipped', 0)} skipped")


def last_result(last: ScrubLast | None) -> Text:
    if not last:
        return Text("no scrub has run yet", style="dim")
    t = last.get("totals", {})
    when = datetime.datetime.fromtimestamp(last["finished_ns"] / 1e9, datetime.UTC)
    how = "stopped" if last.get("stopped") else "finished"
    style = "bold red" if t.get("uncorrectable") else ("yellow" if t.get("corrected") else "")
    return Text(f"last: {how} {when:%Y-%m-%d %H:%M} UTC, {format_size(t.get('bytes', 0))} in "
                f"{duration(last.get('seconds'), '-')}\n{_counts(t)}", style=style)


class ScrubPanel(Vertical):
    _shown: ScrubSummary | None = None
    def compose(self):
        yield Static(id="scrub-state")
        yield ProgressBar(total=100, show_eta=False, show_percentage=False,
                          id="scrub-bar")
        yield Static(id="scrub-result")

    def show(self, scrub: ScrubSummary) -> None:
        if scrub == self._shown:           # unchanged: no relayout
            return
        self._shown = scrub
        state = self.query_one("#scrub-state", Static)
        progress_bar = self.query_one("#scrub-bar", ProgressBar)
        result = self.query_one("#scrub-result", Static)
        if scrub.get("state") != "running":
            state.update(Text("idle" if scrub.get("state") == "idle"
                              else scrub.get("state", "unknown"), style="bold"))
            progress_bar.update(total=100, progress=0)
            result.update(last_result(scrub.get("last")))
            return
        t = scrub.get("totals", {})
        total, done = scrub.get("to_scrub") or 0, t.get("bytes", 0)
        limit = f" (limit {rate_text(scrub['rate_limit'])})" if scrub.get("rate_limit") else ""
        state.update(Text(f"running  {100 * scrub.get('progress', 0):.1f}%  "
                          f"{format_size(done)} of {format_size(total)}  "
                          f"{rate_text(scrub.get('rate_now'))}{limit}  ETA "
                          f"{duration(scrub.get('eta_seconds'), '-')}", style="bold"))
        progress_bar.update(total=max(total, 1), progress=min(done, total))
        so_far = Text(f"so far: {_counts(t)}\n")
        so_far.append_text(last_result(scrub.get("last")))
        result.update(so_far)
