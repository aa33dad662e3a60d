"""`events --since` past the largest integer SQLite keeps was an internal error (exit 70,
issue 14, "also seen"). Any since is taken: past every id there is, no events; below 0,
all of them."""
from __future__ import annotations


def test_since_beyond_any_event_id_answers_no_events(daemon):
    daemon.cli("mkdir", "d", check=True)
    for since in (2**63, 2**63 - 1, 2**64 + 5):
        proc = daemon.cli("events", "--since", str(since), "--json")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() in (b"[]", b""), proc.stdout
    with daemon.client() as c:
        assert c.events(since=2**70) == []
        assert [e["kind"] for e in c.events(since=-5)][-1] == "mkdir"
