"""A full state disk for real (issue 13): the state directory on a small tmpfs, filled to the
last byte. Every change fails with one clear line and changes nothing (what `ls` shows, the
memory held, what the keeper holds); once space returns, service goes on by itself and
`gpumemctl check` is clean. tests/unit/test_journal_faults.py fails each statement in turn;
this is the same on a real disk, through the CLI."""
from __future__ import annotations

import os

from tests.harness import fill_filesystem, wait_for

NO_SPACE = 7            # a full state disk is out of space, not a bug (issue 24)


def seen(d) -> dict:
    status = d.cli_json("status")
    return {"ls": d.cli_json("ls", "-R"), "free": [dev["free"] for dev in status["devices"]],
            "kept": status["keeper"]["held"]}


def test_a_full_state_disk_changes_nothing_and_service_resumes(small_state_disk):
    d = small_state_disk
    d.cli("mkdir", "keep", check=True)
    d.cli("create", "keep/durable", "--size", "8M", "--durable", check=True)
    d.cli("create", "keep/trans1", "--size", "8M", check=True)
    filler = fill_filesystem(d.state_dir)
    before = seen(d)

    # Changes the registry must record before they are answered: refused whole.
    for args in (["rm", "keep/durable"], ["mkdir", "newdir"],
                 ["create", "new", "--size", "8M", "--durable"], ["transient", "keep/durable"],
                 ["durable", "keep/trans1"], ["create", "a/b", "--size", "1M"]):
        proc = d.cli(*args)
        stderr = proc.stderr.decode()
        assert proc.returncode == NO_SPACE, f"{args}: {proc.returncode} {stderr}"
        assert "nothing was changed" in stderr and stderr.count("\n") == 1, stderr
        assert seen(d) == before, f"gpumemctl {' '.join(args)} changed something"

    # Changes to transient allocations alone are answered before their (group) commit and
    # never outlive the daemon: they go on in memory, and the registry catches up.
    d.cli("rm", "keep/trans1", check=True)
    d.cli("create", "keep/trans2", "--size", "4M", check=True)

    os.unlink(filler)                                        # space returns
    wait_for(lambda: d.cli("check").returncode == 0, timeout=10,
             what="check to be clean once the registry can be written")
    assert sorted(e["path"] for e in d.cli_json("ls", "-R")) == \
        ["keep", "keep/durable", "keep/trans2"]
    d.cli("create", "new", "--size", "8M", "--durable", check=True)   # service goes on
    d.cli("mkdir", "newdir", check=True)
    assert d.cli("check").returncode == 0
    d.restart(hard=True)                                     # what was kept is right
    names = sorted(e["path"] for e in d.cli_json("ls", "-R"))
    assert names == ["keep", "keep/durable", "new", "newdir"]
