"""Running test code as another uid (nobody by default), to see what a second user can and
cannot do. Needs root.

run_as forks: the child drops to the given credentials and calls the function, which must
have imported everything it needs already (the venv's interpreter and stdlib live under
/root, which uid 65534 cannot read, so nothing may be imported after the drop). The child
reports what happened as JSON through a pipe and always leaves with os._exit().
"""
from __future__ import annotations

import json
import os
import signal

NOBODY = 65534


def run_as(fn, *args, uid: int = NOBODY, gid: int = NOBODY, groups=(), timeout: int = 60):
    """Run fn(*args) in a forked child with the given credentials; returns its JSON result.

    The child never returns into pytest: it writes {"ok": result} or {"crash": text} to a pipe
    and calls os._exit. An alarm kills it if it hangs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # ---- child
        status = 0
        try:
            os.close(r)
            signal.alarm(timeout)
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            assert os.getuid() == uid and os.geteuid() == uid and os.getgid() == gid
            out = {"ok": fn(*args)}
        except BaseException as exc:               # noqa: BLE001 - reported to the parent
            out = {"crash": f"{type(exc).__name__}: {exc}"}
            status = 1
        try:
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(status)
    os.close(w)                                     # ---- parent
    chunks = []
    with os.fdopen(r, "rb") as f:
        while True:
            chunk = f.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
    _, wstatus = os.waitpid(pid, 0)
    raw = b"".join(chunks)
    assert raw, f"child died without a report (wait status {wstatus})"
    out = json.loads(raw)
    assert "crash" not in out, f"child crashed: {out['crash']}"
    return out["ok"]


class HeldAs:
    """A child as another uid that keeps what it made until the test lets it go: `fn(*args)`
    returns (report, things to keep); the report (JSON) is `self.report`. The child then
    waits for the parent to close the control pipe, so that its connections, descriptors or
    mappings stay alive while the test looks at the daemon. Use as a context manager."""

    def __init__(self, fn, *args, uid: int = NOBODY, gid: int = NOBODY, before=None,
                 timeout: int = 120):
        self.fn, self.args, self.uid, self.gid = fn, args, uid, gid
        self.before, self.timeout = before, timeout   # before(): in the child, still root
        self.report = None

    def __enter__(self):
        report_r, report_w = os.pipe()
        self._hold_r, self._hold_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                               # ---- child
            try:
                os.close(report_r)
                os.close(self._hold_w)
                signal.alarm(self.timeout)
                if self.before is not None:
                    self.before()
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                out, kept = self.fn(*self.args)
                data = json.dumps({"ok": out}).encode()
            except BaseException as exc:               # noqa: BLE001 - reported
                data, kept = json.dumps({"crash": f"{type(exc).__name__}: {exc}"}).encode(), None
            try:
                while data:
                    data = data[os.write(report_w, data):]
                os.close(report_w)
                os.read(self._hold_r, 1)                # until the parent lets go
            finally:
                del kept
                os._exit(0)
        os.close(report_w)                              # ---- parent
        os.close(self._hold_r)
        with os.fdopen(report_r, "rb") as f:
            raw = f.read()
        assert raw, "the child died without a report"
        out = json.loads(raw)
        assert "crash" not in out, f"child crashed: {out['crash']}"
        self.report = out["ok"]
        return self

    def __exit__(self, *exc):
        os.close(self._hold_w)
        os.waitpid(self.pid, 0)
