"""Fixtures of the unit tier, which calls the daemon's parts directly and starts no process of
the daemon's: the keeper is the in-process double (tests/unit/world.py)."""
from __future__ import annotations

import pytest

from daemon.keeper.link import ProcessKeeper

from .world import World


@pytest.fixture
def world(tmp_path):
    """A manager on a real registry, the host backend (256 MiB) and the keeper double."""
    w = World(tmp_path)
    yield w
    w.close()


@pytest.fixture(autouse=True)
def _no_keeper_process(monkeypatch):
    """A unit test that would start a keeper process fails (the integration tier is where the
    real keeper runs)."""
    def refuse(self):
        pytest.fail(f"a unit test tried to start a keeper process for {self.path}; use the "
                    "`world` fixture (the in-process keeper) or move the test to "
                    "tests/integration", pytrace=False)
    monkeypatch.setattr(ProcessKeeper, "_spawn", refuse)
