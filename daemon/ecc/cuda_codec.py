"""The CUDA codec: RS(136,128) encode/verify and block checksums on the device.

Kernels (daemon/ecc/gpu_kernels.cu) are compiled at first use by NVRTC for the device's
architecture and cached on disk (cache_dir, keyed by the sha256 of source + options and the
architecture), so a daemon restart loads a cubin instead of compiling. The API mirrors
daemon/ecc/cpu.py on device pointers (the daemon's own mappings); results come back to the
host and every call ends synchronised, so the caller may free the memory afterwards.

encode, verify and repair (Berlekamp-Massey, Chien search and Forney, one thread per codeword
of each damaged block) all run on the GPU.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re

import numpy as np

from gpumemctl import cudadrv

from .layout import BLOCK, CHECKSUM_BYTES, CLEAN, CORRECTED, PARITY_BLOCK, PRIM, UNCORRECTABLE

log = logging.getLogger("gpumemd")

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_kernels.cu")
GENERATOR = (1, 227, 44, 178, 71, 172, 8, 224, 37)     # g(x), x^8 first (checked below)
GROUPS = int(os.environ.get("GPUMEMD_ECC_GROUPS", "2"))   # 4-codeword groups a thread
THREADS = 256 // GROUPS                                  # per data block (gpu_kernels.cu)
DAMAGED, REFRESHED, NEEDS_REPAIR = 1, 1, 3


def _gf_mul(a: int, b: int) -> int:
    out = 0
    while b:
        if b & 1:
            out ^= a
        a = (a << 1) ^ (PRIM if a & 0x80 else 0)
        b >>= 1
    return out


def _generator() -> tuple[int, ...]:
    g = [1]
    root = 1
    for _ in range(8):
        root = _gf_mul(root, 2)
        g = [a ^ _gf_mul(b, root) for a, b in zip(g + [0], [0] + g)]
    return tuple(g)


def rs_step_source() -> str:
    """RS_STEP's body: the shift register step, r_i = r_(i+1) ^ g_(i+1) * fb, with each
    multiplication by a constant written as the XOR of fb * x^k (x0..x7) for its set bits."""
    lines = []
    for i, coeff in enumerate(GENERATOR[1:]):
        terms = " ^ ".join(f"x{k}" for k in range(8) if coeff >> k & 1)
        lines.append(f"r{i} = r{i + 1} ^ ({terms});" if i < 7 else f"r7 = {terms};")
    return " ".join(lines)


def gf_tables() -> tuple[list[int], list[int]]:
    """exp (512 entries, doubled so exp[log a + log b] needs no modulo) and log tables."""
    exp, log, x = [0] * 512, [0] * 256, 1
    for i in range(255):
        exp[i], log[x] = x, i
        x = _gf_mul(x, 2)
    for i in range(255, 512):
        exp[i] = exp[i - 255]
    return exp, log


def hot_loop_macros(groups: int) -> str:
    """The kernels' inner loop for `groups` chains per thread, written out (see the comment
    above @HOT_LOOP@ in gpu_kernels.cu)."""
    stride = 256 // groups
    ks, regs = range(groups), range(8)
    step = rs_step_source()
    lines = [f"#define GROUPS {groups}u", f"#define THREADS {stride}u", f"#define STRIDE {stride}u",
             "#define PARITYG(m) \\"]
    lines += ["    unsigned int " + ", ".join(f"r{k}_{i} = 0" for k in ks for i in regs) + "; \\",
              "    unsigned int s1 = 0, s2 = 0; \\",
              '    _Pragma("unroll 4") \\',
              "    for (unsigned int j = 0; j < 128; j++) { \\"]
    for k in ks:
        lines += [f"        unsigned int w{k} = __ldg((m) + j * ROW_WORDS + {k} * STRIDE); \\",
                  f"        s1 += w{k}; \\",
                  f"        s2 += (2u * (j * ROW_WORDS + threadIdx.x + {k} * STRIDE) + 1u)"
                  f" * w{k}; \\",
                  f"        unsigned int x{k}_0 = w{k} ^ r{k}_0; \\"]
    for e in range(1, 8):
        lines.append("        unsigned int " + ", ".join(f"x{k}_{e} = xt(x{k}_{e - 1})" for k in ks)
                     + "; \\")
    for k in ks:
        body = re.sub(r"\b([rx])(\d)\b", lambda m, k=k: f"{m[1]}{k}_{m[2]}", step)
        lines.append(f"        {body} \\")
    lines.append("    }")
    lines.append("#define STOREG(p) { " + " ".join(
        f"(p)[{i} * ROW_WORDS + {k} * STRIDE] = r{k}_{i};" for k in ks for i in regs) + " }")
    lines.append("#define DIFFG(p) (" + " | ".join(
        f"((p)[{i} * ROW_WORDS + {k} * STRIDE] ^ r{k}_{i})" for k in ks for i in regs) + ")")
    return "\n".join(lines)


def source_text(groups: int = GROUPS) -> str:
    """gpu_kernels.cu with its inner loop written out from g(x), and the decoder's GF(2^8)
    tables."""
    assert _generator() == GENERATOR
    exp, log = gf_tables()
    with open(SOURCE) as f:
        return (f.read().replace("@HOT_LOOP@", hot_loop_macros(groups))
                .replace("GF_EXP_TABLE", ",".join(map(str, exp)))
                .replace("GF_LOG_TABLE", ",".join(map(str, log))))


def _nvrtc_check(result, prog=None, what: str = "") -> None:
    from cuda.bindings import nvrtc
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        detail = ""
        if prog is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            detail = buf.decode(errors="replace").strip()
        raise cudadrv.CudaError(f"NVRTC {what} failed: {result} {detail}", call=what)


def compile_cubin(src: str, arch: str) -> bytes:
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"kernels.cu", 0, [], [])
    _nvrtc_check(err, what="nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _nvrtc_check(err, prog, "nvrtcCompileProgram")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _nvrtc_check(err, what="nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _nvrtc_check(err, what="nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class GpuCodec:
    def __init__(self, index: int, cache_dir: str | None):
        self.index = index
        major = cudadrv.attribute(index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = cudadrv.attribute(index, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        self.arch = f"sm_{major}{minor}"
        src = source_text()
        key = hashlib.sha256((src + self.arch).encode()).hexdigest()[:32]
        self.compiled_from_cache = False
        cubin = None
        path = os.path.join(cache_dir, f"rs-{self.arch}-{key}.cubin") if cache_dir else None
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                cubin = f.read()
            self.compiled_from_cache = True
        if cubin is None:
            cubin = compile_cubin(src, self.arch)
            if path:
                os.makedirs(cache_dir, mode=0o700, exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(cubin)
                os.replace(tmp, path)          # atomic: a concurrent start never sees half
        self.cache_path = path
        with cudadrv.context(index):
            self.module = cudadrv._cu("cuModuleLoadData", cubin)
            self.fn = {name: cudadrv._cu("cuModuleGetFunction", self.module, name.encode())
                       for name in ("rs_encode", "rs_check", "rs_check_refresh",
                                    "rs_decode")}
            self.stream = cudadrv.stream_create()
        self._scratch, self._scratch_size = 0, 0
        self._fix = 0          # repair scratch: a block, its parity, results, flags

    # ---- plumbing -----------------------------------------------------------------------
    def _launch(self, name: str, grid: int, args: tuple, types: tuple) -> None:
        cudadrv._cu("cuLaunchKernel", self.fn[name], grid, 1, 1, THREADS, 1, 1, 0,
                    self.stream, (args, types), 0)

    def _scratch_for(self, size: int) -> int:
        if size > self._scratch_size:
            if self._scratch:
                cudadrv._cu("cuMemFree", self._scratch)
            self._scratch = int(cudadrv._cu("cuMemAlloc", size))
            self._scratch_size = size
        return self._scratch

    def _sync(self) -> None:
        cudadrv.stream_synchronize(self.stream)

    def _to_host(self, ptr: int, n: int) -> np.ndarray:
        out = np.empty(n, np.uint8)
        cudadrv.memcpy_dtoh(out.ctypes.data, ptr, n)
        return out

    def _to_device(self, ptr: int, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        cudadrv.memcpy_htod(ptr, arr.ctypes.data, arr.nbytes)

    def _encode(self, d: int, p: int, c: int, n: int) -> None:
        self._launch("rs_encode", n, (d, p, c, n),
                     (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint))

    # ---- the API (daemon/ecc/cpu.py) ------------------------------------------------------
    def encode(self, d: int, p: int, c: int, n: int) -> None:
        if not n:
            return
        with cudadrv.context(self.index):
            self._encode(d, p, c, n)
            self._sync()

    def _flags(self, d: int, p: int, c: int, n: int):
        """(parity mismatch per block, checksum mismatch per block), in one pass."""
        flags = self._scratch_for(n * 4)
        self._launch("rs_check", n, (d, p, c, flags, n),
                     (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_uint))
        self._sync()
        bits = self._to_host(flags, n * 4).view(np.uint32)
        return (bits & 1) != 0, (bits & 2) != 0

    def verify(self, d: int, p: int, c: int, n: int) -> np.ndarray:
        if not n:
            return np.zeros(0, np.uint8)
        with cudadrv.context(self.index):
            parity_bad, sum_bad = self._flags(d, p, c, n)
        return np.where(parity_bad | sum_bad, DAMAGED, CLEAN).astype(np.uint8)

    def repair(self, d: int, p: int, c: int, n: int):
        """Damaged blocks (found by the check pass) are decoded on the GPU, one at a time, on
        a scratch copy, which replaces the block only if every codeword decoded and the
        corrected data's checksum matches (docs/ecc.md, "Decode rules")."""
        status = np.zeros(n, np.uint8)
        corrected = np.zeros(n, np.int64)
        if not n:
            return status, corrected
        with cudadrv.context(self.index):
            parity_bad, sum_bad = self._flags(d, p, c, n)
            for b in np.nonzero(parity_bad | sum_bad)[0]:
                b = int(b)
                status[b], corrected[b] = self._repair_block(
                    d + b * BLOCK, p + b * PARITY_BLOCK, c + b * CHECKSUM_BYTES)
        return status, corrected

    def _repair_block(self, d: int, p: int, c: int) -> tuple[int, int]:
        if not self._fix:
            self._fix = int(cudadrv._cu("cuMemAlloc", BLOCK + PARITY_BLOCK + 1024 * 4 + 4))
        sd, sp = self._fix, self._fix + BLOCK
        res, flag = sp + PARITY_BLOCK, sp + PARITY_BLOCK + 1024 * 4
        self._copy(sd, d, BLOCK)
        self._copy(sp, p, PARITY_BLOCK)
        cudadrv._cu("cuLaunchKernel", self.fn["rs_decode"], 4, 1, 1, 256, 1, 1, 0,
                    self.stream, ((sd, sp, res),
                                  (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)), 0)
        self._sync()
        found = self._to_host(res, 1024 * 4).view(np.int32)
        if (found < 0).any():
            return UNCORRECTABLE, 0
        symbols = int(found.sum())
        self._launch("rs_check", 1, (sd, sp, c, flag, 1),
                     (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_uint))
        self._sync()
        bits = int(self._to_host(flag, 4).view(np.uint32)[0])
        if bits == 0 and symbols:                  # decoded, and the checksum agrees
            self._copy(d, sd, BLOCK)
            self._copy(p, sp, PARITY_BLOCK)
            self._sync()
            return CORRECTED, symbols
        if bits == 2 and not symbols:              # data and parity agree: the stored
            self._encode(d, p, c, 1)               # checksum is what was damaged
            self._sync()
            return CORRECTED, 0
        return (CLEAN, 0) if bits == 0 else (UNCORRECTABLE, 0)

    def _copy(self, dst: int, src: int, n: int) -> None:
        cudadrv._cu("cuMemcpyDtoDAsync", dst, src, n, self.stream)

    def verify_refresh(self, d: int, p: int, c: int, n: int) -> np.ndarray:
        """One fused pass (rs_check_refresh): 0 clean, REFRESHED where the data's checksum
        matched and the parity was rewritten from it, NEEDS_REPAIR where it did not."""
        if not n:
            return np.zeros(0, np.uint8)
        with cudadrv.context(self.index):
            flags = self._scratch_for(n * 4)
            self._launch("rs_check_refresh", n, (d, p, c, flags, n),
                         (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_uint))
            self._sync()
            bits = self._to_host(flags, n * 4).view(np.uint32)
        return np.select([bits == 1, bits == 2], [REFRESHED, NEEDS_REPAIR], CLEAN).astype(
            np.uint8)
