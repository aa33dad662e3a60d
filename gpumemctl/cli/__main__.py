"""`python -m gpumemctl.cli` (gpumemd's own snapshots: daemon/services/autosnap.py)."""
import signal

from . import main

if __name__ == "__main__":
    # gpumemd blocks its stop signals (daemon/signals.py), and a child inherits the mask: a
    # snapshot it runs must stop on SIGTERM like any command.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))
    main()
