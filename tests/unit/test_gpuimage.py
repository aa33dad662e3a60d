"""The GPU codec's kernel image (daemon/ecc/gpuimage.py) is compiled once in a process: gpumemd
prebuilds it on a thread at start-up, and an rs allocation that needs the codec meanwhile waits
for that compile and loads its result, instead of compiling the same kernels beside it (two
NVRTC runs fighting for the CPU; 2.4 s each on a freshly started GPU machine). No GPU needed:
NVRTC is replaced by a stand-in that takes its time and counts."""
from __future__ import annotations

import os
import threading
import time

from daemon.ecc import gpuimage

IMAGE = b"\x7fELF kernels" * 64


def test_a_first_use_during_the_prebuild_waits_for_it_and_loads_its_result(tmp_path,
                                                                            monkeypatch):
    compiles = []
    started = threading.Event()

    def compile_(source, name, options, *, cubin=True):
        compiles.append(options)
        started.set()
        time.sleep(0.3)                      # NVRTC at work
        return IMAGE, ""
    monkeypatch.setattr(gpuimage.cudadrv, "nvrtc_compile", compile_)
    monkeypatch.setattr(gpuimage.cudadrv, "nvrtc_supported_archs", lambda: [80, 90])
    monkeypatch.setattr(gpuimage.cudadrv, "nvrtc_version", lambda: (12, 8))
    monkeypatch.setattr(gpuimage.cudadrv, "compute_capability", lambda index: (9, 0))
    where = tmp_path / "ecc-cache"
    where.mkdir(mode=0o700)
    os.chmod(where, 0o700)

    thread = gpuimage.prebuild([0], str(where))
    assert started.wait(5)                   # the prebuild is compiling
    image, from_cache, _, arch = gpuimage.load_or_compile((9, 0), str(where))
    thread.join(5)
    assert (image, from_cache, arch) == (IMAGE, True, "sm_90")
    assert len(compiles) == 1
