"""The ECC layout, version 1, and the per-block checksum (both in docs/ecc.md).

Data block b: bytes [b*BLOCK, (b+1)*BLOCK) of an allocation. Its parity: bytes
[b*PARITY_BLOCK, (b+1)*PARITY_BLOCK) of the parity region. Codeword c (0 <= c < CODEWORDS)
of a block has message byte j at data[j*CODEWORDS + c] (j = 0..127, m_0 the highest-degree
coefficient) and parity byte i at parity[i*CODEWORDS + c] (i = 0..7).

The parity region of an allocation of capacity C holds C/16 bytes of parity, then
C/BLOCK checksums of CHECKSUM_BYTES each.
"""
from __future__ import annotations

BLOCK = 128 * 1024          # data bytes per block
CODEWORDS = 1024            # codewords per block (interleaved)
MESSAGE = 128               # message bytes per codeword
NSYM = 8                    # parity bytes per codeword
PARITY_BLOCK = NSYM * CODEWORDS     # 8192 parity bytes per block (6.25%)
CHECKSUM_BYTES = 8          # per block: docs/ecc.md
PRIM = 0x11D                # x^8 + x^4 + x^3 + x^2 + 1
FCR = 1                     # first consecutive root: alpha^1
MAX_CORRECT = NSYM // 2     # 4 symbol errors per codeword

# Block status codes, as both codecs report them.
CLEAN, CORRECTED, UNCORRECTABLE = 0, 1, 2


def blocks(capacity: int) -> int:
    if capacity % BLOCK:
        raise ValueError(f"capacity {capacity} is not a multiple of {BLOCK}")
    return capacity // BLOCK


def parity_bytes(capacity: int) -> int:
    """Size of the parity region: parity, then the checksums."""
    n = blocks(capacity)
    return n * PARITY_BLOCK + n * CHECKSUM_BYTES
