"""The keeper: a small process that holds the exported fds of durable allocations
(process.py, run as `python -m daemon.keeper`), and the daemon's link to it (link.py).

Kept empty on purpose: the keeper must start fast and import nothing heavy."""
