// XXH3-128 (seed 0, default secret) of each block of a span of device memory: the snapshot
// block checksum (docs/snapshots.md, "Format"), bit-identical to the xxhash package's
// xxh3_128 so that a manifest made by the CPU path verifies here and the other way round.
// gpumemctl/snapshots/gpuhash.py compiles this file with NVRTC (no includes).
//
// Kernel xxh3_blocks(data, size, block, nblocks, out): block j is bytes
// [j*block, min((j+1)*block, size)) of data; out[2j] = low 64 bits, out[2j+1] = high 64 bits.
// data must be 8-byte aligned and block a multiple of 1024.
//
// The long-input path (> 240 bytes) keeps 8 64-bit accumulators: each 64-byte stripe adds,
// per lane i, its word v_i to acc[i^1] and lo32(v_i^key)*hi32(v_i^key) to acc[i]; after
// every 16 stripes (a 1 KiB "xxh block") the accumulators are scrambled. Within one xxh block
// the updates are sums (mod 2^64), so they may be added in any order: one warp takes one
// hash block, thread t reads words t, t+32, t+64, t+96 of each xxh block (lane t%8 of
// stripes t/8, t/8+4, ...: 256 contiguous bytes per load across the warp), forms
// x_t = its products + the words of thread t^1 (lane i^1), and two shuffles sum x over the
// four threads of lane t%8. Every thread then holds acc[t%8] and scrambles it; the chain of
// scrambles is the only sequential part. tests/integration/test_snapshot_gpuhash_split.py is
// this exact split in numpy, checked against xxhash on the VM.

typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned long long u64;

#ifndef XXH_WARPS
#define XXH_WARPS 4              // hash blocks (warps) per CTA
#endif
#define XXH_UNROLL 4             // xxh blocks loaded ahead (4 KiB per warp in flight)

#define P32_1 0x9E3779B1ull
#define P32_2 0x85EBCA77ull
#define P32_3 0xC2B2AE3Dull
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull
#define MX1 0x165667919E3779F9ull
#define MX2 0x9FB21C651E98DF25ull
#define FULL 0xffffffffu

__constant__ u8 kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

// ---------------------------------------------------------------- little helpers
// Little-endian reads at any byte offset (the secret's odd offsets, a tail's unaligned words).
__device__ __forceinline__ u64 sec64(int o)
{
    u64 r = 0;
    for (int k = 7; k >= 0; --k) r = (r << 8) | kSecret[o + k];
    return r;
}

__device__ __forceinline__ u32 sec32(int o) { return (u32)(sec64(o) & 0xffffffffull); }

__device__ __forceinline__ u64 rd64(const u8* p)
{
    u64 r = 0;
    for (int k = 7; k >= 0; --k) r = (r << 8) | p[k];
    return r;
}

__device__ __forceinline__ u32 rd32(const u8* p)
{
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ u64 fold(u64 a, u64 b) { return (a * b) ^ __umul64hi(a, b); }

__device__ __forceinline__ u64 av64(u64 h)
{
    h ^= h >> 33; h *= P64_2; h ^= h >> 29; h *= P64_3; return h ^ (h >> 32);
}

__device__ __forceinline__ u64 av3(u64 h)
{
    h ^= h >> 37; h *= MX1; return h ^ (h >> 32);
}

__device__ __forceinline__ u64 product(u64 v, u64 key)
{
    u64 k = v ^ key;
    return (k & 0xffffffffull) * (k >> 32);
}

// ---------------------------------------------------------------- 0..240 bytes (one thread)
__device__ void len_0to16(const u8* d, u32 n, u64* lo, u64* hi)
{
    if (n > 8) {
        u64 bl = sec64(32) ^ sec64(40), bh = sec64(48) ^ sec64(56);
        u64 ilo = rd64(d), ihi = rd64(d + n - 8);
        u64 x = ilo ^ ihi ^ bl;
        u64 mlo = x * P64_1, mhi = __umul64hi(x, P64_1);
        mlo += (u64)(n - 1) << 54;
        ihi ^= bh;
        mhi += ihi + (ihi & 0xffffffffull) * (P32_2 - 1);
        mlo ^= __byte_perm((u32)(mhi >> 32), 0, 0x0123) |
               ((u64)__byte_perm((u32)mhi, 0, 0x0123) << 32);   // byte swap of mhi
        u64 l2 = mlo * P64_2, h2 = __umul64hi(mlo, P64_2) + mhi * P64_2;
        *lo = av3(l2); *hi = av3(h2);
    } else if (n >= 4) {
        u64 x = (u64)rd32(d) + ((u64)rd32(d + n - 4) << 32);
        u64 k = x ^ (sec64(16) ^ sec64(24));
        u64 m = P64_1 + ((u64)n << 2);
        u64 mlo = k * m, mhi = __umul64hi(k, m);
        mhi += mlo << 1;
        mlo ^= mhi >> 3;
        mlo ^= mlo >> 35; mlo *= MX2; mlo ^= mlo >> 28;
        *lo = mlo; *hi = av3(mhi);
    } else if (n > 0) {
        u32 c = ((u32)d[0] << 16) | ((u32)d[n >> 1] << 24) | (u32)d[n - 1] | (n << 8);
        u32 sw = __byte_perm(c, 0, 0x0123);
        u32 ch = (sw << 13) | (sw >> 19);
        *lo = av64((u64)c ^ (u64)(sec32(0) ^ sec32(4)));
        *hi = av64((u64)ch ^ (u64)(sec32(8) ^ sec32(12)));
    } else {
        *lo = av64(sec64(64) ^ sec64(72));
        *hi = av64(sec64(80) ^ sec64(88));
    }
}

__device__ __forceinline__ void mix32(u64* lo, u64* hi, const u8* a, const u8* b, int so)
{
    *lo += fold(rd64(a) ^ sec64(so), rd64(a + 8) ^ sec64(so + 8));
    *lo ^= rd64(b) + rd64(b + 8);
    *hi += fold(rd64(b) ^ sec64(so + 16), rd64(b + 8) ^ sec64(so + 24));
    *hi ^= rd64(a) + rd64(a + 8);
}

__device__ void len_17to240(const u8* d, u32 n, u64* rlo, u64* rhi)
{
    u64 lo = (u64)n * P64_1, hi = 0;
    if (n <= 128) {
        for (int i = (int)((n - 1) / 32); i >= 0; --i)
            mix32(&lo, &hi, d + 16 * i, d + n - 16 * (i + 1), 32 * i);
    } else {
        for (u32 i = 32; i < 160; i += 32) mix32(&lo, &hi, d + i - 32, d + i - 16, i - 32);
        lo = av3(lo); hi = av3(hi);
        for (u32 i = 160; i <= n; i += 32) mix32(&lo, &hi, d + i - 32, d + i - 16, 3 + i - 160);
        mix32(&lo, &hi, d + n - 16, d + n - 32, 136 - 17 - 16);
    }
    *rlo = av3(lo + hi);
    *rhi = 0ull - av3(lo * P64_1 + hi * P64_4 + (u64)n * P64_2);
}

// ---------------------------------------------------------------- > 240 bytes (one warp)
// Sum x over the four threads of this thread's lane (t, t^8, t^16, t^24).
__device__ __forceinline__ u64 lane_sum(u64 x)
{
    x += __shfl_xor_sync(FULL, x, 8);
    return x + __shfl_xor_sync(FULL, x, 16);
}

__device__ __forceinline__ u64 merge(const u64* acc, int so, u64 start)
{
    u64 r = start;
    for (int i = 0; i < 4; ++i)
        r += fold(acc[2 * i] ^ sec64(so + 16 * i), acc[2 * i + 1] ^ sec64(so + 16 * i + 8));
    return av3(r);
}

__device__ void hash_long(const u8* d, u64 n, int t, u64* out)
{
    const int lane = t & 7;
    const u64 init[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    u64 acc = init[lane];
    u64 key[4];
    for (int k = 0; k < 4; ++k) key[k] = sec64(8 * ((t >> 3) + 4 * k + lane));
    const u64 skey = sec64(128 + 8 * lane);
    const u64* w = (const u64*)d;
    const u64 nb = (n - 1) / 1024;          // whole xxh blocks, each followed by a scramble
    u64 j = 0;
    for (; j + XXH_UNROLL <= nb; j += XXH_UNROLL) {
        u64 v[XXH_UNROLL][4];
        for (int u = 0; u < XXH_UNROLL; ++u)
            for (int k = 0; k < 4; ++k) v[u][k] = __ldg(w + (j + u) * 128 + t + 32 * k);
        for (int u = 0; u < XXH_UNROLL; ++u) {
            u64 p = 0, s = 0;
            for (int k = 0; k < 4; ++k) { p += product(v[u][k], key[k]); s += v[u][k]; }
            acc += lane_sum(p + __shfl_xor_sync(FULL, s, 1));
            acc ^= acc >> 47; acc ^= skey; acc *= P32_1;
        }
    }
    for (; j < nb; ++j) {
        u64 p = 0, s = 0;
        for (int k = 0; k < 4; ++k) {
            u64 v = __ldg(w + j * 128 + t + 32 * k);
            p += product(v, key[k]); s += v;
        }
        acc += lane_sum(p + __shfl_xor_sync(FULL, s, 1));
        acc ^= acc >> 47; acc ^= skey; acc *= P32_1;
    }
    // the stripes of the last, partial xxh block (no scramble after them)
    const u64 ns = ((n - 1) - 1024 * nb) / 64;
    u64 p = 0, s = 0;
    for (int k = 0; k < 4; ++k) {
        if ((u64)((t >> 3) + 4 * k) < ns) {
            u64 v = __ldg(w + nb * 128 + t + 32 * k);
            p += product(v, key[k]); s += v;
        }
    }
    acc += lane_sum(p + __shfl_xor_sync(FULL, s, 1));
    // the last 64 bytes (any alignment), secret at 192 - 64 - 7; threads 0..7, one lane each
    p = s = 0;
    if (t < 8) {
        s = rd64(d + n - 64 + 8 * t);
        p = product(s, sec64(121 + 8 * t));
    }
    u64 x = p + __shfl_xor_sync(FULL, s, 1);
    acc += __shfl_sync(FULL, x, lane);
    u64 a[8];
    for (int i = 0; i < 8; ++i) a[i] = __shfl_sync(FULL, acc, i);
    if (t == 0) {
        out[0] = merge(a, 11, n * P64_1);
        out[1] = merge(a, 192 - 64 - 11, ~(n * P64_2));
    }
}

extern "C" __global__ void __launch_bounds__(32 * XXH_WARPS)
xxh3_blocks(const u8* data, u64 size, u64 block, u64 nblocks, u64* out)
{
    const u64 j = (u64)blockIdx.x * XXH_WARPS + threadIdx.x / 32;
    const int t = threadIdx.x & 31;
    if (j >= nblocks) return;               // a whole warp leaves together
    const u64 at = j * block;
    const u64 n = (size - at < block) ? size - at : block;
    const u8* d = data + at;
    if (n > 240) {
        hash_long(d, n, t, out + 2 * j);
    } else if (t == 0) {
        u64 lo, hi;
        if (n <= 16) len_0to16(d, (u32)n, &lo, &hi);
        else len_17to240(d, (u32)n, &lo, &hi);
        out[2 * j] = lo;
        out[2 * j + 1] = hi;
    }
}
