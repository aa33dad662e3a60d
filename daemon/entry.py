"""gpumemd's console script: start the daemon, or say in one line which extra to install.

`pip install gpumemctl` alone is the client (docs/operations.md); gpumemd's own packages come
with the `daemon` extra, and daemon/main.py imports them at module scope. So the script starts
here, where nothing but the standard library is imported, and a client-only install that runs
`gpumemd` gets one line naming the command to run instead of a traceback.
"""
from __future__ import annotations

import importlib.util
import sys

# The import names of the daemon extra's packages (pyproject.toml) that gpumemd cannot run
# without; nvidia-ml-py is left out: without it gpumemd runs, only GPU telemetry is missing.
DAEMON_MODULES = ("trio", "pyfuse3", "numpy")
CANNOT_START = 1            # gpumemd's exit status when it cannot start (gpumemd(8))


def missing_modules() -> list[str]:
    return [name for name in DAEMON_MODULES if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        print(f"gpumemd: cannot start without the daemon extra (missing: {', '.join(missing)}):"
              " pip install 'gpumemctl[daemon]'", file=sys.stderr)
        return CANNOT_START
    from .main import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
