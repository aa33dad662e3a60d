"""POSIX behaviour of the mount, one test per operation (helpers in tests/mount/posix.py).

All helpers run on one mount, each leaving it empty, and the consistency check (`gpumemctl
check`) must be clean afterwards."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.harness import MOUNT_BACKEND, Daemon, fuse_missing, make_base_dir

from . import posix, posix_hardlinks, posix_links

CHECKS = posix.ALL + posix_links.ALL + posix_hardlinks.ALL


@pytest.fixture(scope="module")
def shared_mount(tmp_path_factory):
    """One daemon for the whole module: the helpers clean up after themselves."""
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    extra = ["--host-capacity", "1G"] if MOUNT_BACKEND == "host" else []
    d = Daemon(make_base_dir(), backend=MOUNT_BACKEND, mount=True, extra_args=extra).start()
    yield d
    d.stop()
    d.cleanup()
    log = d.log()
    shutil.rmtree(d.base, ignore_errors=True)
    assert "Traceback" not in log and " ERROR: " not in log, log[-4000:]


@pytest.mark.parametrize("check", CHECKS, ids=[f.__name__[4:] for f in CHECKS])
def test_posix(shared_mount, check):
    check(shared_mount.mnt)
    assert os.listdir(shared_mount.mnt) == []
    assert shared_mount.cli_json("ls") == []
    shared_mount.cli("check", check=True)
