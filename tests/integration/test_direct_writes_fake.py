"""WRITE served by the init-flags library on the cuda backend, on the fake CUDA
driver (tests/fakecuda), in CI (issue 29; docs/mount.md, "Writes from C"). Where
the backend copies by DMA the library receives every request into its own buffer, lent to
libfuse at each receive and taken back after the dispatch, and the mount page-locks its head:
each WRITE's bytes then go to the device straight from there. What a user observes: every
byte reads back, through the mount and through the daemon's socket, by either path; and the
daemon's log at unmount counts the WRITEs that came from that buffer (all of them), or none
where WRITEs go through pyfuse3 (libfuse's own buffer then)."""
from __future__ import annotations

import os

import pytest

from tests import fakecuda
from tests.mount.test_direct_writes import exercise


@pytest.fixture
def mounted(fake_lib, daemon_factory):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")

    def make(**env: str):
        return daemon_factory(backend="cuda", env={**fakecuda.env(fake_lib), **env},
                              mount=True)
    return make


def test_writes_come_from_the_libraries_page_locked_buffer(mounted):
    _, direct, pinned = exercise(mounted())
    assert direct >= 4 + 4 + 1 and pinned == direct


def test_through_pyfuse3_libfuse_keeps_its_buffer(mounted):
    assert exercise(mounted(GPUMEMD_FUSE_WRITES="pyfuse3"))[1:] == (0, 0)
