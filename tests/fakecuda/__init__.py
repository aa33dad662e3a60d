"""A fake libcuda.so.1 (fakecuda.c) that lets the cuda backend, the client's CUDA data path and
attach() run on machines without a GPU. Processes opt in through LD_LIBRARY_PATH (see env());
the test process itself never loads it."""
from __future__ import annotations

import os
import shutil
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakecuda.c")


def build(directory: str) -> str | None:
    """Compile the fake driver into `directory`; returns the directory, or None where no C
    compiler is available."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = os.path.join(directory, "libcuda.so.1")
    proc = subprocess.run([cc, "-O1", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1",
                           "-o", out, SOURCE, "-lpthread"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the fake libcuda failed:\n{proc.stderr}")
    return directory


def env(libdir: str, **settings: str) -> dict:
    """Environment additions that make a child process load the fake driver; `settings` are
    FAKECUDA_* knobs (e.g. FAKECUDA_NO_DMABUF="1")."""
    path = libdir + (os.pathsep + os.environ["LD_LIBRARY_PATH"]
                     if os.environ.get("LD_LIBRARY_PATH") else "")
    return {"LD_LIBRARY_PATH": path, **settings}
