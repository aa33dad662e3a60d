"""The monitor's only road to gpumemd: blocking calls through `gpumemctl.Client`, made from
worker threads so that drawing never waits on the daemon.

Three kinds of connection, so that one slow thing never holds up another:
- one long-lived connection for snapshots (`status` + `ls -R`, once a second or when told
  something changed), re-opened after the daemon comes back;
- one subscription (`subscribe`: events and change notices), ended by `close()`;
- a short connection per action (create, verify...), so a verify of terabytes does not
  stall the snapshots.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from gpumemctl.client import Client
from gpumemctl.protocol import NotRunning, ProtocolError, default_socket
from gpumemctl.protocol.replies import Change, Node

from .model import Snapshot


class DaemonSource:
    def __init__(self, socket_path: str | None = None):
        self.socket_path = socket_path or default_socket()
        self._lock = threading.Lock()           # one snapshot at a time on _client
        self._client: Client | None = None
        self._subscription: Client | None = None
        self._closed = False

    # ---- snapshots --------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Raises NotRunning when the daemon cannot be reached (or hung up)."""
        with self._lock:
            start = time.perf_counter()
            try:
                client = self._client or self._connect()
                status = client.status()
                entries = client.ls("", recursive=True)
            except (NotRunning, ProtocolError, OSError) as exc:
                self._drop_client()
                if isinstance(exc, NotRunning):
                    raise
                raise NotRunning(f"gpumemd stopped answering ({exc})") from None
            return Snapshot(status, entries, (time.perf_counter() - start) * 1000)

    def _connect(self) -> Client:
        if self._closed:
            raise NotRunning("the monitor is closing")
        self._client = Client(self.socket_path, client_name="gpumemctl-top", timeout=10.0)
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- subscription -----------------------------------------------------------------
    def subscribe(self, since: int | None, backlog: int = 100) -> Iterator[Change]:
        """Events (after `since`, or else the last `backlog` ones) and change notices, until
        the daemon goes away (NotRunning) or close() is called (the iterator just ends)."""
        client = Client(self.socket_path, client_name="gpumemctl-top", timeout=None)
        self._subscription = client
        if self._closed:
            client.close()
            return
        try:
            stream = client.subscribe(since=since, limit=backlog)
            if since is None and stream.last_event:     # the newest few, for context
                for event in self.call("events", since=max(0, stream.last_event - backlog),
                                       limit=backlog):
                    if event["id"] <= stream.last_event:
                        yield {"type": "event", "event": event}
            yield from stream
        except (NotRunning, ProtocolError, OSError):
            if not self._closed:
                raise NotRunning("gpumemd ended the subscription") from None
        finally:
            client.close()

    # ---- actions -----------------------------------------------------------------------
    def call(self, method: str, *args, **kwargs):
        """One action on its own connection: `Client.<method>(*args, **kwargs)`."""
        with Client(self.socket_path, client_name="gpumemctl-top") as client:
            return getattr(client, method)(*args, **kwargs)

    def info(self, path: str) -> Node:
        return self.call("info", path)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every connection; a thread blocked on one returns."""
        self._closed = True
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()
        self._drop_client()


