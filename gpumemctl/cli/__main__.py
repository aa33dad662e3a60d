"""`python -m gpumemctl.cli` (gpumemd's own snapshots: daemon/services/autosnap.py)."""
from . import main

if __name__ == "__main__":
    main()
