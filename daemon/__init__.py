"""gpumemd: the daemon that owns durable GPU memory.

Kept empty on purpose: `python -m daemon.keeper` must import nothing heavy (no CUDA, no trio).
"""
