"""ECC: Reed-Solomon RS(136,128) parity and per-block checksums (layout and vectors: docs/ecc.md).

layout.py   the layout and the checksum definition, shared by both codecs
cpu.py      the numpy codec (host backend; the reference in tests)
gpu.py      the CUDA codec (cuda backend): kernels in kernels.cu, compiled by NVRTC
"""
