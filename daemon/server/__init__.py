"""The socket server: a thin adapter from framed requests to the verbs (daemon/verbs/).

    transport.py    the listening socket, peer credentials, framed I/O on one connection
    limits.py       the rates of connections: pace, answered refusals, minute warnings
    service.py      Server: a connection's handshake and session, dispatch of each request
    ops.py          the op table: each op's handler, argument schema and way of answering
    schema.py       argument schemas and their checks (the protocol's usage errors)
    call.py         what a handler gets and returns; what a session may see of others
    allocations.py  handlers of the namespace and data ops (ls, create, open, attach, ...)
    streams.py      events, and the multi-frame answers: streams and progress frames
    status.py       status and devices (telemetry, totals, scrub progress, quotas)
    verify.py       verify, recover, scrub, check, debug_corrupt (the integrity ops)

See docs/protocol.md.
"""
from gpumemctl.protocol.release import VERSION

from .service import Server
from .verify import ecc_summary

__all__ = ["VERSION", "Server", "ecc_summary"]
