"""Snapshots of durable allocations, taken and restored by a client (`gpumemctl snapshot`,
docs/snapshots.md): engine.py names what the CLI calls. A package of its own (this file makes
it a regular one, which the import contracts of pyproject.toml see into)."""
