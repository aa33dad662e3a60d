"""The numpy ECC codec: RS(136,128) parity over interleaved 128 KiB blocks, plus per-block
checksums (layout, checksum, status codes, rules: docs/ecc.md; constants: layout.py).

Every function takes whole blocks as flat uint8 arrays (views of an mmap are fine: nothing is
copied wholesale, and in-place writes land in the caller's memory); n = len(data) // BLOCK:
    encode(data, parity, checksums)          write parity (n*8192) and checksums (n*8)
    checksum(data)                           the n*8 checksum bytes
    verify(data, parity, checksums)          per block CLEAN or DAMAGED
    repair(data, parity, checksums)          in place: (status, symbols corrected) per block

Speed comes from linearity over GF(2): a codeword's parity is the XOR over message positions j
of the parity of (m_j at position j, zeros elsewhere), so one 128 x 256 table of packed 8-byte
parities turns encoding into a gather and an XOR per message row, vectorised over all the
codewords of a batch. Verification is encoding plus a compare (a codeword is valid exactly when
its parity equals the parity of its message); syndromes are computed only for codewords that
fail it, from the parity difference alone.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from daemon.ecc.layout import (
    BLOCK,
    CHECKSUM_BYTES,
    CLEAN,
    CODEWORDS,
    CORRECTED,
    FCR,
    MAX_CORRECT,
    MESSAGE,
    NSYM,
    PARITY_BLOCK,
    PRIM,
    UNCORRECTABLE,
)

# Status codes beyond layout's CLEAN / CORRECTED / UNCORRECTABLE (docs/ecc.md):
DAMAGED = 1         # verify(): parity or checksum disagrees with the data; run repair()

LENGTH = MESSAGE + NSYM     # 136 symbols per codeword; position k is the coefficient of x^(135-k)
BATCH = 16                  # blocks per pass: 2 MiB of data, temporaries stay in cache

# ---------------------------------------------------------------- GF(2^8) tables, built once


def _gf_tables():
    exp = np.zeros(2 * 255, np.uint8)
    log = np.zeros(256, np.int64)
    x = 1
    for i in range(255):
        exp[i], log[x] = x, i
        x <<= 1
        if x & 0x100:
            x ^= PRIM
    exp[255:] = exp[:255]
    mul = exp[log[:, None] + log[None, :]]
    mul[0, :] = mul[:, 0] = 0
    inv = exp[(255 - log) % 255]
    inv[0] = 0      # never used as a divisor: callers check for zero first
    return exp, mul, inv


_EXP, _MUL, _INV = _gf_tables()


def _alpha(e: int) -> int:
    return int(_EXP[e % 255])


def _generator() -> list[int]:
    """g(x) = (x - a^1)...(x - a^8), highest degree first."""
    g = [1]
    for i in range(FCR, FCR + NSYM):
        root = _alpha(i)
        g = [a ^ int(_MUL[b, root]) for a, b in zip(g + [0], [0] + g, strict=True)]
    return g


def _encode_table() -> np.ndarray:
    """_ENC[j][v]: the parity of the message with v at position j, packed p_0..p_7 as the bytes
    of one uint64 (so XOR of packed values is XOR of parities, and a uint8 view unpacks it)."""
    g = _generator()
    rem = g[1:]                 # x^8 mod g(x): coefficients of x^7..x^0, i.e. p_0..p_7
    unit = {}                   # degree d -> x^d mod g(x)
    for d in range(NSYM, LENGTH):
        unit[d] = rem
        top = rem[0]
        rem = rem[1:] + [0]     # times x, then reduce the x^8 term
        rem = [r ^ int(_MUL[top, c]) for r, c in zip(rem, g[1:], strict=True)]
    table = np.empty((MESSAGE, 256, NSYM), np.uint8)
    for j in range(MESSAGE):
        table[j] = _MUL[:, unit[LENGTH - 1 - j]]   # m_j is the coefficient of x^(127-j), times x^8
    return table.view(np.uint64)[..., 0].copy()


def _syndrome_table() -> np.ndarray:
    """_SYN[i][v]: syndromes S_1..S_8 (packed like _ENC) of v at parity position i (x^(7-i))."""
    table = np.empty((NSYM, 256, NSYM), np.uint8)
    for i in range(NSYM):
        for s in range(NSYM):
            table[i, :, s] = _MUL[:, _alpha((FCR + s) * (NSYM - 1 - i))]
    return table.view(np.uint64)[..., 0].copy()


def _chien_table() -> np.ndarray:
    """_XINV[e][k] = (X_k^-1)^e, X_k = a^(135-k) the locator of codeword position k."""
    e = np.arange(NSYM)[:, None]
    k = np.arange(LENGTH)[None, :]
    return _EXP[(-e * (LENGTH - 1 - k)) % 255]


_ENC = _encode_table()
_SYN = _syndrome_table()
_XINV = _chien_table()
# _TERMS[e][v][k] = v (X_k^-1)^e: one locator term at every position, for the Chien search.
_TERMS = np.stack([_MUL[:, _XINV[e]] for e in range(MAX_CORRECT + 1)])
# (2i+1) mod 2^32 for word i of a block: the second checksum sum's weights.
_WEIGHTS = (2 * np.arange(BLOCK // 4, dtype=np.uint32) + 1)

# ---------------------------------------------------------------- argument handling


def _u8(a, name: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        a = np.frombuffer(a, dtype=np.uint8)    # bytes, bytearray, mmap, memoryview
    # A non-contiguous array would reshape to a copy, and in-place repairs would be lost.
    if a.dtype != np.uint8 or not a.flags.c_contiguous:
        raise TypeError(f"{name}: need a contiguous uint8 array, got {a.dtype} {a.shape}")
    return a.reshape(-1)


def _args(data, parity=None, checksums=None):
    data = _u8(data, "data")
    if len(data) % BLOCK:
        raise ValueError(f"data: {len(data)} bytes is not a multiple of {BLOCK}")
    n = len(data) // BLOCK
    out = [data.reshape(n, MESSAGE, CODEWORDS)]
    for a, name, size in ((parity, "parity", PARITY_BLOCK),
                          (checksums, "checksums", CHECKSUM_BYTES)):
        if a is not None:
            a = _u8(a, name)
            if len(a) != n * size:
                raise ValueError(f"{name}: {len(a)} bytes, expected {n * size} for {n} blocks")
            out.append(a.reshape(n, -1))
    return n, out


def _batches(n: int):
    for b0 in range(0, n, BATCH):
        yield slice(b0, min(n, b0 + BATCH))

# ---------------------------------------------------------------- encoding and checksums


def _parity(d: np.ndarray) -> np.ndarray:
    """Parity of blocks d (nb, 128, 1024) as (nb, 8, 1024): the layout of the parity region.
    The code is linear and a zero symbol adds nothing, so rows that are zero in every block
    are skipped: a small file in a slab's block, or a file's first bytes, cost their rows,
    not the block's 128 (issue 29: an fsync of a 4 KiB SQLite page 0.14 instead of 1.2 ms)."""
    nb = d.shape[0]
    acc = np.zeros((nb, CODEWORDS), np.uint64)
    tmp = np.empty_like(acc)
    idx = np.empty(acc.shape, np.intp)
    for j in np.flatnonzero(d.any(axis=2).any(axis=0)):
        idx[...] = d[:, j, :]   # take() on intp indices is ~8x faster than on uint8 ones
        np.take(_ENC[j], idx, out=tmp, mode="clip")    # clip: no bounds-error path; idx < 256
        acc ^= tmp
    return acc.view(np.uint8).reshape(nb, CODEWORDS, NSYM).transpose(0, 2, 1)


def _checksums(d: np.ndarray) -> np.ndarray:
    """docs/ecc.md: s1 = sum w_i, s2 = sum (2i+1) w_i mod 2^32 over little-endian words w_i."""
    w = d.reshape(d.shape[0], -1).view("<u4")
    s1 = w.sum(axis=1, dtype=np.uint32)              # uint32 accumulators wrap: mod 2^32
    s2 = (w * _WEIGHTS).sum(axis=1, dtype=np.uint32)
    return np.stack([s1, s2], axis=1).astype("<u4").view(np.uint8)


def encode(data, parity, checksums) -> None:
    n, (d, p, c) = _args(data, parity, checksums)
    for s in _batches(n):
        p[s] = _parity(d[s]).reshape(-1, PARITY_BLOCK)
        c[s] = _checksums(d[s])


def checksum(data) -> np.ndarray:
    n, (d,) = _args(data)
    out = np.empty((n, CHECKSUM_BYTES), np.uint8)
    for s in _batches(n):
        out[s] = _checksums(d[s])
    return out.reshape(-1)


def _scan(d, p, c):
    """One batch: the parity difference (nb, 8, 1024), which codewords are inconsistent
    (nb, 1024), which blocks' checksums differ (nb,), and the recomputed sums."""
    sums = _checksums(d)
    delta = _parity(d) ^ p.reshape(-1, NSYM, CODEWORDS)
    return delta, delta.any(axis=1), (sums != c).any(axis=1), sums


def verify(data, parity, checksums) -> np.ndarray:
    n, (d, p, c) = _args(data, parity, checksums)
    status = np.empty(n, np.uint8)
    for s in _batches(n):
        _, bad, sum_bad, _ = _scan(d[s], p[s], c[s])
        status[s] = np.where(bad.any(axis=1) | sum_bad, DAMAGED, CLEAN)
    return status


# ---------------------------------------------------------------- decoding


def _syndromes(delta: np.ndarray) -> np.ndarray:
    """S_1..S_8 (N, 8) of codewords whose parity differs from their message's by delta (N, 8):
    the received word minus the codeword of its own message has those syndromes."""
    acc = np.zeros(len(delta), np.uint64)
    for i in range(NSYM):
        acc ^= _SYN[i][delta[:, i]]
    return acc.view(np.uint8).reshape(-1, NSYM)


def _shift(poly: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Each row of poly (coefficient e of x^e in column e) times x^m[row], truncated."""
    width = poly.shape[1]
    padded = np.concatenate([np.zeros_like(poly), poly], axis=1)
    cols = width + np.arange(width)[None, :] - m[:, None]
    return np.take_along_axis(padded, cols, axis=1)


def _berlekamp_massey(S: np.ndarray):
    """Error locators Lambda (N, 9; Lambda_0 = 1) and their lengths L, one codeword per row,
    every row stepping together (np.where instead of branches)."""
    N = len(S)
    C = np.zeros((N, NSYM + 1), np.uint8)
    C[:, 0] = 1
    B = C.copy()
    L = np.zeros(N, np.int64)
    m = np.ones(N, np.int64)
    b = np.ones(N, np.uint8)
    for n in range(NSYM):
        d = S[:, n].copy()                      # discrepancy
        for i in range(1, n + 1):
            d ^= _MUL[C[:, i], S[:, n - i]]
        nz = d != 0
        grow = nz & (2 * L <= n)
        update = C ^ _MUL[_MUL[d, _INV[b]][:, None], _shift(B, m)]
        B = np.where(grow[:, None], C, B)
        C = np.where(nz[:, None], update, C)
        L = np.where(grow, n + 1 - L, L)
        b = np.where(grow, d, b)
        m = np.where(grow, 1, m + 1)
    return C, L


def _chien(lam: np.ndarray) -> np.ndarray:
    """Which positions k are roots of Lambda (N, 5), i.e. Lambda(X_k^-1) == 0: (N, 136)."""
    out = np.zeros((len(lam), LENGTH), np.uint8)
    for e in range(lam.shape[1]):
        out ^= _TERMS[e][lam[:, e]]     # row gathers: 136 bytes at a time
    return out == 0


def _decode(S: np.ndarray):
    """Decode codewords with syndromes S (N, 8): (ok (N,), error values (N, 136)). A row is ok
    only if its locator has degree L <= 4 and exactly L roots inside the shortened code, and
    every Forney magnitude is nonzero; rows that are not ok have all-zero errors."""
    lam, L = _berlekamp_massey(S)
    degree = NSYM - np.argmax(lam[:, ::-1] != 0, axis=1)
    ok = (L <= MAX_CORRECT) & (degree == L)
    lam = lam[:, :MAX_CORRECT + 1]      # rows with a higher degree are already not ok
    roots = _chien(lam)
    ok &= roots.sum(axis=1) == L
    # Forney with fcr = 1: Y = Omega(X^-1) / Lambda'(X^-1), Omega = S(x) Lambda(x) mod x^8,
    # evaluated at the roots only (at most 4 per codeword, not all 136 positions).
    omega = np.zeros_like(S)
    for e in range(NSYM):
        for i in range(min(e, MAX_CORRECT) + 1):
            omega[:, e] ^= _MUL[lam[:, i], S[:, e - i]]
    row, k = np.nonzero(roots)
    num = np.zeros(len(row), np.uint8)
    for e in range(NSYM):
        num ^= _MUL[omega[row, e], _XINV[e, k]]
    den = lam[row, 1] ^ _MUL[lam[row, 3], _XINV[2, k]]     # char 2: only odd terms survive
    y = _MUL[num, _INV[den]]
    ok[row[(den == 0) | (y == 0)]] = False
    err = np.zeros((len(S), LENGTH), np.uint8)
    err[row, k] = y
    err[~ok] = 0
    return ok, err


def _fix_block(d, p, c, cws, ok, err) -> tuple[int, int]:
    """Correct one block's damaged codewords cws (error values err), all or nothing: the
    corrections are staged on copies and kept only if every codeword decoded, the corrected
    block is consistent and its data matches the stored checksum."""
    if not ok.all():
        return UNCORRECTABLE, 0
    rows, ks = np.nonzero(err)
    cw, values = cws[rows], err[rows, ks]
    dk, pk = ks < MESSAGE, ks >= MESSAGE
    data, par = d.copy(), p.reshape(NSYM, CODEWORDS).copy()
    data[ks[dk], cw[dk]] ^= values[dk]
    par[ks[pk] - MESSAGE, cw[pk]] ^= values[pk]
    if (_parity(data[None])[0] != par).any() or (_checksums(data[None])[0] != c).any():
        return UNCORRECTABLE, 0     # a miscorrection (more than 4 errors somewhere)
    d[ks[dk], cw[dk]] = data[ks[dk], cw[dk]]
    p.reshape(NSYM, CODEWORDS)[ks[pk] - MESSAGE, cw[pk]] = par[ks[pk] - MESSAGE, cw[pk]]
    return CORRECTED, len(values)


def repair(data, parity, checksums) -> tuple[np.ndarray, np.ndarray]:
    """In place. Per block: (status CLEAN / CORRECTED / UNCORRECTABLE, symbols corrected).
    An UNCORRECTABLE block is left exactly as it was (docs/ecc.md, decode rules)."""
    n, (d, p, c) = _args(data, parity, checksums)
    status = np.zeros(n, np.uint8)
    corrected = np.zeros(n, np.int64)
    for s in _batches(n):
        delta, bad, sum_bad, sums = _scan(d[s], p[s], c[s])
        # Data and parity agree, only the checksum differs: the checksum is the damaged part.
        lone = sum_bad & ~bad.any(axis=1)
        c[s][lone] = sums[lone]
        status[s][lone] = CORRECTED
        blk, cws = np.nonzero(bad)
        if not len(blk):
            continue
        ok, err = _decode(_syndromes(delta[blk, :, cws]))
        for b in np.unique(blk):
            rows = blk == b
            i = s.start + b
            status[i], corrected[i] = _fix_block(d[i], p[i], c[i], cws[rows], ok[rows], err[rows])
    return status, corrected

# ---------------------------------------------------------------- measurement


def bench(size_mb: int = 256) -> dict[str, float]:
    """Print and return MB/s (of data) for each operation on size_mb MiB of random data."""
    n = size_mb * 2**20 // BLOCK
    data = np.random.default_rng(1).integers(0, 256, n * BLOCK, dtype=np.uint8)
    parity = np.empty(n * PARITY_BLOCK, np.uint8)
    sums = np.empty(n * CHECKSUM_BYTES, np.uint8)
    rates = {}

    def timed(name, fn, nbytes=data.size):
        t = time.perf_counter()
        fn()
        rates[name] = nbytes / (time.perf_counter() - t) / 1e6
        print(f"{name:34s} {rates[name]:8.0f} MB/s", flush=True)

    timed("encode", lambda: encode(data, parity, sums))
    timed("checksum", lambda: checksum(data))
    timed("verify", lambda: verify(data, parity, sums))
    timed("repair (clean)", lambda: repair(data, parity, sums))
    # Worst damage that still repairs: a 4096-byte burst in each of (up to) 512 blocks, so all
    # 1024 codewords of every one of them go through the decoder.
    k = min(n, 512)
    for b in range(k):
        data[b * BLOCK + 5000: b * BLOCK + 9096] ^= 0x5A
    timed("repair (a 4 KiB burst per block)",
          lambda: repair(data[:k * BLOCK], parity[:k * PARITY_BLOCK], sums[:k * CHECKSUM_BYTES]),
          k * BLOCK)
    return rates


if __name__ == "__main__":
    bench(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
