"""Sessions (daemon/core/sessions.py): one client connection, its credentials and what it
holds."""
from __future__ import annotations

from daemon.core.sessions import Session

from .parts import ALICE, ROOT


def test_each_session_has_its_own_id_and_holdings():
    first, second = Session(cred=ROOT), Session(cred=ALICE, client="gpumemctl 1.0")
    assert second.id > first.id
    first.holders[1] = "h"
    first.revoked.add(1)
    assert second.holders == {} and second.revoked == set()
    assert (second.cred.uid, second.client, second.closed) == (1000, "gpumemctl 1.0", False)


def test_sessions_compare_by_identity():
    assert Session(cred=ROOT) != Session(cred=ROOT)
    session = Session(cred=ROOT)
    assert session in {session}
