"""The snapshot block-hash kernel (gpumemctl/snapshots/xxh3.cu) run on the CPU: the file
itself, compiled by the host's C++ compiler under a shim that runs one warp as 32 threads in
lockstep at each shuffle (__shfl_xor_sync, __shfl_sync through a barrier). So the exact
split of a block's stripes over a warp, the tails and the short paths are checked against
the xxhash package on a machine without a GPU (test_snapshot_gpuhash_emulated.py), and the
GPU data path of snapshots can run on the fake CUDA driver (gpuhash_emu/)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

KERNEL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "gpumemctl", "snapshots", "xxh3.cu")

SHIM = r"""
#include <cstdint>
#include <barrier>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __constant__ static
#define __launch_bounds__(x)
struct Idx { unsigned x; };
thread_local Idx threadIdx, blockIdx;
thread_local int tl_t;
static std::barrier<> *bar;
static uint64_t slot[32];
static uint64_t shfl(uint64_t v, int src) {
    slot[tl_t] = v; bar->arrive_and_wait();
    uint64_t r = slot[src]; bar->arrive_and_wait(); return r;
}
#define __shfl_xor_sync(m, v, x) shfl((v), tl_t ^ (x))
#define __shfl_sync(m, v, l) shfl((v), (l))
static inline uint64_t __umul64hi(uint64_t a, uint64_t b) {
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
}
static inline uint32_t __byte_perm(uint32_t x, uint32_t, uint32_t) {   // only 0x0123 used
    return __builtin_bswap32(x);
}
template <class T> static inline T __ldg(const T* p) { return *p; }
#define XXH_WARPS 1
#include KERNEL_PATH
extern "C" void run(const u8* data, u64 size, u64 block, u64 nblocks, u64* out) {
    for (u64 b = 0; b < nblocks; ++b) {
        std::barrier<> br(32); bar = &br;
        std::vector<std::thread> warp;
        for (int t = 0; t < 32; ++t)
            warp.emplace_back([=] { tl_t = t; threadIdx.x = t; blockIdx.x = (unsigned)b;
                                    xxh3_blocks(data, size, block, nblocks, out); });
        for (auto& th : warp) th.join();
    }
}
"""


def build(directory: str) -> str | None:
    """Compile the emulation into `directory`; its path, or None without a C++20 compiler."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return None
    src = os.path.join(directory, "xxh3_emu.cpp")
    out = os.path.join(directory, "libxxh3emu.so")
    with open(src, "w") as f:
        f.write(SHIM.replace("KERNEL_PATH", f'"{KERNEL}"'))
    proc = subprocess.run([cxx, "-std=c++20", "-O2", "-shared", "-fPIC", "-o", out, src,
                           "-lpthread"], capture_output=True, text=True)
    if proc.returncode != 0:
        if "barrier" in proc.stderr:
            return None                     # a compiler without C++20's <barrier>
        raise RuntimeError(f"building the xxh3.cu emulation failed:\n{proc.stderr}")
    return out


class Emulated:
    """xxh3_blocks of the kernel, on host memory at `ptr` (the fake driver's "device"
    memory is host memory)."""

    def __init__(self, library: str):
        self.lib = ctypes.CDLL(library)
        self.lib.run.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint64, ctypes.c_void_p]

    def words(self, ptr: int, size: int, block: int) -> list[int]:
        """(low, high) 64-bit words of each block's XXH3-128, as the kernel writes them."""
        n = -(-size // block)
        out = (ctypes.c_uint64 * (2 * max(n, 1)))()
        self.lib.run(ptr, size, block, n, ctypes.addressof(out))
        return list(out)[:2 * n]
