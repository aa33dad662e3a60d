"""Automatic snapshots: `snapshot_on_stop` and `restore_on_start` (config keys,
docs/snapshots.md).

gpumemd runs `gpumemctl snapshot ...` as a child process, as its own user, against its own
socket. The data then moves the way it moves for any user (the memory by fd, the client's
pinned staging buffers and parallel file I/O), the event loop only answers the child's
requests meanwhile (every other client is served as usual), and the daemon imports no client
code (docs/architecture.md). The child's one-line errors and its JSON summary go to the log.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ..verbs.refill import RefillVerbs

log = logging.getLogger("gpumemd")


def _command(socket_path: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpumemctl.cli", "--socket", socket_path, "snapshot",
            *args]


async def _run(argv: list[str], what: str) -> dict | None:
    """Run the child; its summary (stdout JSON) or None. Cancelled (a second SIGTERM), the
    child is killed with the scope."""
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)          # the child is not the service
    proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True,
                                  check=False, env=env, stdin=b"")
    for line in proc.stderr.decode(errors="replace").splitlines():
        log.warning("%s: %s", what, line)
    try:
        summary = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        summary = None
    if proc.returncode != 0:
        log.error("%s ended with exit status %d", what, proc.returncode)
    return summary


async def restore_lost(refill: RefillVerbs, socket_path: str, snapshot_dir: str) -> None:
    """restore_on_start: refill every allocation found lost from the newest snapshot. Each
    is `lost` and queued (reads say so, EAGAIN on the mount) until its turn, `restoring`
    while it fills, `ready` once its blocks are checked."""
    queued = refill.queue_restores()
    if not queued:
        return
    log.info("restore_on_start: restoring %d lost allocation(s) from %s", len(queued),
             snapshot_dir)
    try:
        summary = await _run(_command(socket_path, "restore", snapshot_dir, "--lost-only",
                                      "--quiet", "--json"), "restore_on_start")
    finally:
        refill.unqueue_restores(queued)
    if summary is not None:
        done = sum(1 for a in summary.get("allocations", []) if a.get("result") == "ok")
        log.info("restore_on_start: %d of %d allocation(s) restored from %s in %.2f s "
                 "(%d degraded, %d failed)", done, len(queued), summary.get("location"),
                 summary.get("seconds") or 0, summary.get("damaged", 0),
                 summary.get("failed", 0))


async def snapshot_before_stop(socket_path: str, snapshot_dir: str,
                               signals) -> None:
    """snapshot_on_stop: an incremental snapshot of every durable allocation, while the
    daemon still serves. A second SIGTERM/SIGINT stops waiting for it."""
    log.info("snapshot_on_stop: snapshotting the durable allocations into %s", snapshot_dir)
    async with trio.open_nursery() as nursery:
        async def on_second_signal() -> None:
            async for signum in signals:
                log.warning("received %s again: stopping without finishing the snapshot",
                            signal.Signals(signum).name)
                nursery.cancel_scope.cancel()

        nursery.start_soon(on_second_signal)
        summary = await _run(_command(socket_path, "create", snapshot_dir, "--incremental",
                                      "--quiet", "--json"), "snapshot_on_stop")
        nursery.cancel_scope.cancel()
    if summary is not None:
        log.info("snapshot_on_stop: %s: %d allocation(s), %d bytes (%d written) in %.2f s",
                 summary.get("location"), len(summary.get("allocations", [])),
                 summary.get("bytes", 0), summary.get("bytes_written", 0),
                 summary.get("seconds") or 0)
