"""Tier (b) of the filesystem tests: a real gpumemd with a real FUSE mount in a temp dir.

The backend is the host backend in CI; on the GPU machine the same tests run on the cuda
backend with GPUMEMD_TEST_BACKEND=cuda (docs/gpu.md).
"""
from __future__ import annotations

import os
import shutil

import pytest

BACKEND = os.environ.get("GPUMEMD_TEST_BACKEND", "host")


def _fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: no FUSE here"
    if not shutil.which("fusermount3"):
        return "fusermount3 is not installed (apt-get install fuse3)"
    return None


@pytest.fixture
def mounted_factory(daemon_factory):
    reason = _fuse_missing()
    if reason:
        pytest.skip(reason)

    def make(**kw):
        kw.setdefault("backend", BACKEND)
        extra = list(kw.pop("extra_args", ()))
        if BACKEND == "host" and not any(a.startswith("--host-capacity") for a in extra):
            extra += ["--host-capacity", "1G"]
        return daemon_factory(mount=True, extra_args=extra, **kw)
    return make


@pytest.fixture
def mounted(mounted_factory):
    """A daemon serving a mount; `mounted.mnt` is the mount point."""
    return mounted_factory()
