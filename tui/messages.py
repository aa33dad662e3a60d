"""Messages from the monitor's workers to the app. Workers only post these; the handlers
on the app own every change of state (docs/tui.md)."""
from __future__ import annotations

from textual.message import Message

from gpumemctl.protocol.replies import Event, Node
from gpumemctl.protocol.replies import VerifyProgress as ProgressFrame

from .model import Snapshot


class SnapshotReady(Message):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class DaemonDown(Message):
    """A snapshot or the subscription could not reach gpumemd."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class EventArrived(Message):
    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class NodesChanged(Message):
    """Something the table shows changed without an event (holders, state, size)."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__()
        self.paths = paths


class DetailReady(Message):
    """`info` of the selected entry (with holders)."""

    def __init__(self, info: Node) -> None:
        super().__init__()
        self.info = info


class ActionDone(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class ActionFailed(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class VerifyProgress(Message):
    def __init__(self, progress: ProgressFrame) -> None:
        super().__init__()
        self.progress = progress


class VerifyFinished(Message):
    """A verify or recover ended: `summary` as the daemon sent it, or an error text."""

    def __init__(self, title: str, summary: dict | None, error: str | None = None) -> None:
        super().__init__()
        self.title, self.summary, self.error = title, summary, error
