"""The distribution's version, written here and nowhere else.

setuptools reads it for the wheel (pyproject.toml), `gpumemctl.__version__` and `gpumemctl
--version` show it, and gpumemd reports it (`gpumemd --version`, hello, status). It lives in
the protocol package because that, with the CUDA driver module, is all of gpumemctl that the
daemon may import (docs/design.md; the import contracts in pyproject.toml). Not the wire
format's version: that is PROTOCOL_VERSION (defaults.py).
"""
VERSION = "0.1.0"
