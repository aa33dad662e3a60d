// The GPU ECC codec's kernels (daemon/ecc/gpu.py compiles this file with NVRTC; no includes).
//
// Layout (docs/ecc.md, daemon/ecc/layout.py): data block b is 128 KiB = 128 rows of 1024
// bytes; codeword c of a block takes message byte m_j = row j, column c, and its parity byte p_i
// sits at parity[b*8192 + i*1024 + c]. RS(136,128) over GF(2^8), polynomial 0x11D, alpha = 2,
// generator g(x) = (x - a^1)...(x - a^8), codeword position k = coefficient of x^(135-k).
// Checksum per block (docs/ecc.md): 32768 little-endian words w_i, s1 = sum w_i, s2 = sum
// (2i+1) w_i, both mod 2^32, stored as (s1, s2), 8 bytes.
//
// The hot kernels (encode / verify) are bit-sliced: one warp per block, each
// lane owns 32 codewords (columns 16*lane .. 16*lane+15 and 512+16*lane .. 512+16*lane+15, so a
// warp's two 16-byte loads per row each read 512 contiguous bytes). A lane transposes its 32
// bytes of a row into 8 "bit planes" (word k holds bit k of all 32 symbols), and runs the
// systematic encoder's LFSR (division by g(x)) on planes: multiplying the feedback symbol by the
// constant generator coefficients is a fixed GF(2)-linear map, so every bit of the new state is
// an XOR of planes - no tables, no shifts, 32 codewords per instruction. Verification is
// encoding plus a compare: a received word is a codeword exactly when the parity recomputed from
// its message equals its stored parity (all syndromes zero <=> r(x) mod g(x) == 0).
//
// Repair (ecc_repair) runs only on blocks that verify found damaged: one CTA of 1024 threads
// per block, a thread per codeword: syndromes, Berlekamp-Massey, Chien, Forney with log/exp
// tables, corrections staged in a shared-memory copy of the block, applied only if every
// codeword decoded and the corrected data matches the stored checksum.

typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned long long u64;

#define ECC_BLOCK 131072u        // data bytes per block
#define ECC_ROW 1024u            // codewords per block = bytes per row
#define ECC_ROWS 128             // message symbols per codeword
#define ECC_NSYM 8               // parity symbols per codeword
#define ECC_PARITY_BLOCK 8192u   // parity bytes per block

#ifndef ECC_PREFETCH
#define ECC_PREFETCH 2           // rows loaded ahead of the one being encoded (1, 2 or 4)
#endif
#ifndef ECC_WARPS
#define ECC_WARPS 4              // warps (blocks of data) per CTA of the bit-sliced kernels
#endif
#ifndef ECC_MIN_CTAS
#define ECC_MIN_CTAS 4           // resident CTAs per SM asked of ptxas (<= 128 registers)
#endif

// ---------------------------------------------------------------- GF(2^8) at compile time
__host__ __device__ constexpr u32 gf_mul_c(u32 a, u32 b)
{
    u32 r = 0;
    for (int i = 0; i < 8; i++) {
        if (b & 1u) r ^= a;
        b >>= 1;
        a <<= 1;
        if (a & 0x100u) a ^= 0x11Du;
    }
    return r;
}

// Coefficient i (0 = x^8, highest degree first) of g(x) = (x - a^1)...(x - a^8).
__host__ __device__ constexpr u32 gen_coef(int i)
{
    u32 g[ECC_NSYM + 1] = {1, 0, 0, 0, 0, 0, 0, 0, 0};
    u32 root = 1;
    for (int r = 1; r <= ECC_NSYM; r++) {
        root = gf_mul_c(root, 2);
        for (int k = r; k >= 1; k--)
            g[k] ^= gf_mul_c(root, g[k - 1]);
    }
    return g[i];
}

// Bit b of (g_{i+1} * f), as a mask over the bits of f: which feedback planes XOR into bit b
// of the product that register i receives.
__host__ __device__ constexpr u32 gen_mask(int i, int b)
{
    u32 m = 0;
    for (int k = 0; k < 8; k++)
        if ((gf_mul_c(gen_coef(i + 1), 1u << k) >> b) & 1u) m |= 1u << k;
    return m;
}

// ---------------------------------------------------------------- bit-plane transposes
__device__ __forceinline__ void swapmove(u32 &a, u32 &b, int n, u32 m)
{
    u32 t = ((a >> n) ^ b) & m;
    b ^= t;
    a ^= t << n;
}

// 8 words (32 bytes, word w holds bytes 4w..4w+3) -> 8 planes: plane k holds bit k of every
// byte (byte q of word w at bit 8q + w). An involution per stage; from_planes undoes it.
__device__ __forceinline__ void to_planes(u32 *x)
{
    swapmove(x[0], x[1], 1, 0x55555555u); swapmove(x[2], x[3], 1, 0x55555555u);
    swapmove(x[4], x[5], 1, 0x55555555u); swapmove(x[6], x[7], 1, 0x55555555u);
    swapmove(x[0], x[2], 2, 0x33333333u); swapmove(x[1], x[3], 2, 0x33333333u);
    swapmove(x[4], x[6], 2, 0x33333333u); swapmove(x[5], x[7], 2, 0x33333333u);
    swapmove(x[0], x[4], 4, 0x0f0f0f0fu); swapmove(x[1], x[5], 4, 0x0f0f0f0fu);
    swapmove(x[2], x[6], 4, 0x0f0f0f0fu); swapmove(x[3], x[7], 4, 0x0f0f0f0fu);
}

__device__ __forceinline__ void from_planes(u32 *x)
{
    swapmove(x[0], x[4], 4, 0x0f0f0f0fu); swapmove(x[1], x[5], 4, 0x0f0f0f0fu);
    swapmove(x[2], x[6], 4, 0x0f0f0f0fu); swapmove(x[3], x[7], 4, 0x0f0f0f0fu);
    swapmove(x[0], x[2], 2, 0x33333333u); swapmove(x[1], x[3], 2, 0x33333333u);
    swapmove(x[4], x[6], 2, 0x33333333u); swapmove(x[5], x[7], 2, 0x33333333u);
    swapmove(x[0], x[1], 1, 0x55555555u); swapmove(x[2], x[3], 1, 0x55555555u);
    swapmove(x[4], x[5], 1, 0x55555555u); swapmove(x[6], x[7], 1, 0x55555555u);
}

// ---------------------------------------------------------------- memory access
__device__ __forceinline__ uint4 load_stream(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 warp_sum(u32 v)
{
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---------------------------------------------------------------- one LFSR step on planes
// r[i][b]: bit plane b of register i (r[0] = the coefficient of x^7 = p_0 at the end).
// Feedback f = m_j + r[0]; r[i] = r[i+1] + g_{i+1} * f (r[8] = 0). Every output plane is
// r[i+1][b] ^ (XOR of the planes of f picked by gen_mask(i, b)); the picked XORs are shared
// through all 15 combinations of the low and of the high four planes of f. The masks are
// template constants (evaluated by the compiler, never at run time).
template <int I, int B>
__device__ __forceinline__ void lfsr_out(u32 (&r)[ECC_NSYM][8], const u32 (&lo)[16],
                                         const u32 (&hi)[16])
{
    constexpr u32 mk = gen_mask(I, B);
    if constexpr (I + 1 < ECC_NSYM)
        r[I][B] = r[I + 1][B] ^ lo[mk & 15u] ^ hi[mk >> 4];
    else
        r[I][B] = lo[mk & 15u] ^ hi[mk >> 4];
    if constexpr (B < 7)
        lfsr_out<I, B + 1>(r, lo, hi);
    else if constexpr (I + 1 < ECC_NSYM)
        lfsr_out<I + 1, 0>(r, lo, hi);
}

// All 16 XOR combinations of four planes: t[s] = XOR of f_k for the bits k of s.
__device__ __forceinline__ void combos(u32 (&t)[16], u32 f0, u32 f1, u32 f2, u32 f3)
{
    t[0] = 0;           t[1] = f0;          t[2] = f1;          t[3] = f0 ^ f1;
    t[4] = f2;          t[5] = f2 ^ f0;     t[6] = f2 ^ f1;     t[7] = f2 ^ t[3];
    t[8] = f3;          t[9] = f3 ^ f0;     t[10] = f3 ^ f1;    t[11] = f3 ^ t[3];
    t[12] = f3 ^ f2;    t[13] = f3 ^ t[5];  t[14] = f3 ^ t[6];  t[15] = f3 ^ t[7];
}

__device__ __forceinline__ void lfsr_step(u32 (&r)[ECC_NSYM][8], const u32 (&m)[8])
{
    u32 lo[16], hi[16];
    combos(lo, m[0] ^ r[0][0], m[1] ^ r[0][1], m[2] ^ r[0][2], m[3] ^ r[0][3]);
    combos(hi, m[4] ^ r[0][4], m[5] ^ r[0][5], m[6] ^ r[0][6], m[7] ^ r[0][7]);
    lfsr_out<0, 0>(r, lo, hi);
}

// ---------------------------------------------------------------- encode / verify
enum { MODE_ENCODE = 0, MODE_VERIFY = 1 };

template <int MODE>
__device__ __forceinline__ void block_pass(const u8 *__restrict__ data, u8 *__restrict__ parity,
                                           uint2 *__restrict__ cks, u8 *__restrict__ status,
                                           u64 nblocks)
{
    const u64 blk = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31u;
    if (blk >= nblocks) return;                       // whole warps leave together

    // Row j of this lane: uint4 index j*64 + lane and j*64 + 32 + lane of the block.
    const uint4 *src = reinterpret_cast<const uint4 *>(data + blk * ECC_BLOCK) + lane;

    u32 r[ECC_NSYM][8];
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++)
#pragma unroll
        for (int b = 0; b < 8; b++) r[i][b] = 0;

    // Checksum pieces: word q (0..7) of this lane in row j is word 256j + 4*lane + q (q < 4)
    // or 256j + 128 + 4*lane + (q-4) of the block, weight 2i+1 = 512j + 8*lane + dq with
    // dq = 1,3,5,7,257,259,261,263. So s2 = 512 sum_j j*W_j + 8*lane*sum W + sum dq*w.
    u32 s_w = 0, s_jw = 0, s_dq = 0;

    uint4 buf[ECC_PREFETCH][2];
#pragma unroll
    for (int p = 0; p < ECC_PREFETCH; p++) {
        buf[p][0] = load_stream(src + p * 64);
        buf[p][1] = load_stream(src + p * 64 + 32);
    }

#pragma unroll 1
    for (int j0 = 0; j0 < ECC_ROWS; j0 += ECC_PREFETCH) {
#pragma unroll
        for (int p = 0; p < ECC_PREFETCH; p++) {
            const int j = j0 + p;
            u32 x[8] = {buf[p][0].x, buf[p][0].y, buf[p][0].z, buf[p][0].w,
                        buf[p][1].x, buf[p][1].y, buf[p][1].z, buf[p][1].w};
            const int jn = j + ECC_PREFETCH;
            if (jn < ECC_ROWS) {
                buf[p][0] = load_stream(src + jn * 64);
                buf[p][1] = load_stream(src + jn * 64 + 32);
            }
            const u32 w = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
            s_w += w;
            s_jw += (u32)j * w;
            s_dq += x[0] + 3u * x[1] + 5u * x[2] + 7u * x[3]
                  + 257u * x[4] + 259u * x[5] + 261u * x[6] + 263u * x[7];
            to_planes(x);
            lfsr_step(r, x);
        }
    }

    // r[i] -> bytes p_i of this lane's 32 codewords, in the same word order as the data.
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++) from_planes(r[i]);

    const u32 s1 = warp_sum(s_w);
    const u32 s2 = warp_sum(512u * s_jw + 8u * lane * s_w + s_dq);
    uint4 *pdst = reinterpret_cast<uint4 *>(parity + blk * ECC_PARITY_BLOCK) + lane;

    if (MODE == MODE_ENCODE) {
#pragma unroll
        for (int i = 0; i < ECC_NSYM; i++) {
            pdst[i * 64] = make_uint4(r[i][0], r[i][1], r[i][2], r[i][3]);
            pdst[i * 64 + 32] = make_uint4(r[i][4], r[i][5], r[i][6], r[i][7]);
        }
        if (lane == 0) cks[blk] = make_uint2(s1, s2);
        return;
    }

    u32 diff = 0;
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++) {
        const uint4 a = pdst[i * 64], b = pdst[i * 64 + 32];
        diff |= (a.x ^ r[i][0]) | (a.y ^ r[i][1]) | (a.z ^ r[i][2]) | (a.w ^ r[i][3])
              | (b.x ^ r[i][4]) | (b.y ^ r[i][5]) | (b.z ^ r[i][6]) | (b.w ^ r[i][7]);
    }
    const bool stale = __any_sync(0xffffffffu, diff != 0u);
    const uint2 stored = cks[blk];
    const bool match = stored.x == s1 && stored.y == s2;

    // MODE_VERIFY
    if (lane == 0) status[blk] = (stale || !match) ? 1 : 0;
}

extern "C" __global__ void __launch_bounds__(ECC_WARPS * 32, ECC_MIN_CTAS)
ecc_encode(const u8 *__restrict__ data, u8 *__restrict__ parity, uint2 *__restrict__ cks,
           u64 nblocks)
{
    block_pass<MODE_ENCODE>(data, parity, cks, nullptr, nblocks);
}

extern "C" __global__ void __launch_bounds__(ECC_WARPS * 32, ECC_MIN_CTAS)
ecc_verify(const u8 *__restrict__ data, u8 *__restrict__ parity, uint2 *__restrict__ cks,
           u8 *__restrict__ status, u64 nblocks)
{
    block_pass<MODE_VERIFY>(data, parity, cks, status, nblocks);
}

// ---------------------------------------------------------------- read bandwidth yardstick
// XOR of n16 16-byte words, grid-stride; writes only if the XOR equals a magic value (so the
// loads cannot be dropped, and nothing is written in practice).
extern "C" __global__ void __launch_bounds__(256)
ecc_scan(const uint4 *__restrict__ p, u64 n16, u32 *__restrict__ out)
{
    u32 acc = 0;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = load_stream(p + i), b = load_stream(p + i + stride);
        const uint4 c = load_stream(p + i + 2 * stride), d = load_stream(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = load_stream(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// ---------------------------------------------------------------- repair
// GF(2^8) with log/exp tables (in shared memory, built per CTA).
struct Gf {
    const u8 *exp;   // 512 entries: exp[i] = a^(i mod 255)
    const u8 *log;   // 256 entries: log[0] unused
    __device__ __forceinline__ u32 mul(u32 a, u32 b) const
    {
        return (a && b) ? exp[log[a] + log[b]] : 0u;
    }
    __device__ __forceinline__ u32 div(u32 a, u32 b) const    // b != 0
    {
        return a ? exp[log[a] + 255u - log[b]] : 0u;
    }
    __device__ __forceinline__ u32 pow_a(u32 e) const { return exp[e % 255u]; }
};

// Decode one received codeword from its syndromes S[0..7] = S_1..S_8 (not all zero).
// Returns the number of corrections (1..4) written to pos[] (codeword positions 0..135) and
// val[] (the error values to XOR in), or -1 when the word cannot be decoded.
__device__ int rs_decode(const Gf &gf, const u32 (&S)[ECC_NSYM], int (&pos)[4], u32 (&val)[4])
{
    // Berlekamp-Massey; Bs holds x^m B(x), shifted as m grows, so every index is static.
    u32 C[ECC_NSYM + 1], Bs[ECC_NSYM + 1];
#pragma unroll
    for (int i = 0; i <= ECC_NSYM; i++) { C[i] = 0; Bs[i] = 0; }
    C[0] = 1; Bs[1] = 1;
    int L = 0;
    u32 bdisc = 1;
#pragma unroll
    for (int n = 0; n < ECC_NSYM; n++) {
        u32 d = S[n];
#pragma unroll
        for (int i = 1; i <= n; i++) d ^= gf.mul(C[i], S[n - i]);
        if (d) {
            const u32 coef = gf.div(d, bdisc);
            u32 T[ECC_NSYM + 1];
#pragma unroll
            for (int i = 0; i <= ECC_NSYM; i++) { T[i] = C[i]; C[i] ^= gf.mul(coef, Bs[i]); }
            if (2 * L <= n) {
                L = n + 1 - L;
                bdisc = d;
#pragma unroll
                for (int i = ECC_NSYM; i >= 1; i--) Bs[i] = T[i - 1];
                Bs[0] = 0;
                continue;
            }
        }
#pragma unroll
        for (int i = ECC_NSYM; i >= 1; i--) Bs[i] = Bs[i - 1];
        Bs[0] = 0;
    }
    int deg = 0;
#pragma unroll
    for (int i = 1; i <= ECC_NSYM; i++) if (C[i]) deg = i;
    if (L > 4 || deg != L) return -1;

    // Omega(x) = S(x) Lambda(x) mod x^8, S(x) = S_1 + S_2 x + ... + S_8 x^7.
    u32 om[ECC_NSYM];
#pragma unroll
    for (int e = 0; e < ECC_NSYM; e++) {
        u32 v = 0;
#pragma unroll
        for (int i = 0; i <= 4; i++) if (i <= e) v ^= gf.mul(C[i], S[e - i]);
        om[e] = v;
    }
    // Chien search over the 136 positions of the shortened code: position k has locator
    // X = a^(135-k); it is in error when Lambda(X^-1) = 0. Forney (fcr = 1):
    // Y = Omega(X^-1) / Lambda'(X^-1), Lambda'(x) = Lambda_1 + Lambda_3 x^2 in characteristic 2.
    int nf = 0;
    for (int k = 0; k < ECC_ROWS + ECC_NSYM; k++) {
        const u32 xi = (255u - (u32)(ECC_ROWS + ECC_NSYM - 1 - k)) % 255u;   // log of X^-1
        u32 v = C[0];
#pragma unroll
        for (int e = 1; e <= 4; e++) v ^= gf.mul(C[e], gf.pow_a(e * xi));
        if (v) continue;
        if (nf == 4) return -1;
        u32 num = 0;
#pragma unroll
        for (int e = 0; e < ECC_NSYM; e++) num ^= gf.mul(om[e], gf.pow_a(e * xi));
        const u32 den = C[1] ^ gf.mul(C[3], gf.pow_a(2 * xi));
        if (!den) return -1;
        const u32 y = gf.div(num, den);
        if (!y) return -1;
        pos[nf] = k;
        val[nf] = y;
        nf++;
    }
    if (nf != L) return -1;
    // The error pattern must reproduce every syndrome (so the corrected word is a codeword).
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++) {
        u32 s = 0;
        for (int f = 0; f < nf; f++)
            s ^= gf.mul(val[f], gf.pow_a((u32)(i + 1) * (u32)(ECC_ROWS + ECC_NSYM - 1 - pos[f])));
        if (s != S[i]) return -1;
    }
    return nf;
}

// One CTA (1024 threads, one per codeword) per listed block; dynamic shared memory: 128 KiB
// for a copy of the block's data. out_status: layout's CLEAN 0 / CORRECTED 1 /
// UNCORRECTABLE 2; out_fixed: symbols corrected (0 unless CORRECTED).
extern "C" __global__ void __launch_bounds__(1024, 1)
ecc_repair(u8 *__restrict__ data, u8 *__restrict__ parity, uint2 *__restrict__ cks,
           const u32 *__restrict__ list, u8 *__restrict__ out_status, u32 *__restrict__ out_fixed)
{
    extern __shared__ uint4 smem_block[];
    u8 *copy = reinterpret_cast<u8 *>(smem_block);
    __shared__ u8 s_exp[512];
    __shared__ u8 s_log[256];
    __shared__ u32 s_red1[32], s_red2[32];
    __shared__ int s_fail, s_fixed, s_apply;

    const u32 c = threadIdx.x;
    const u64 blk = list[blockIdx.x];
    u8 *d = data + blk * ECC_BLOCK;
    u8 *p = parity + blk * ECC_PARITY_BLOCK;

    if (c == 0) {
        u32 x = 1;
        for (int i = 0; i < 255; i++) {
            s_exp[i] = (u8)x; s_exp[i + 255] = (u8)x; s_log[x] = (u8)i;
            x <<= 1;
            if (x & 0x100u) x ^= 0x11Du;
        }
        s_exp[510] = s_exp[0]; s_exp[511] = s_exp[1]; s_log[0] = 0;
        s_fail = 0; s_fixed = 0; s_apply = 0;
    }
    __syncthreads();
    const Gf gf{s_exp, s_log};

    // Syndromes S_i = r(a^i) by Horner over positions 0..135 (highest degree first).
    u32 S[ECC_NSYM];
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++) S[i] = 0;
    for (int j = 0; j < ECC_ROWS; j++) {
        const u32 v = d[j * ECC_ROW + c];
        copy[j * ECC_ROW + c] = (u8)v;
#pragma unroll
        for (int i = 0; i < ECC_NSYM; i++) S[i] = (S[i] ? s_exp[s_log[S[i]] + i + 1] : 0u) ^ v;
    }
    for (int j = 0; j < ECC_NSYM; j++) {
        const u32 v = p[j * ECC_ROW + c];
#pragma unroll
        for (int i = 0; i < ECC_NSYM; i++) S[i] = (S[i] ? s_exp[s_log[S[i]] + i + 1] : 0u) ^ v;
    }
    u32 any = 0;
#pragma unroll
    for (int i = 0; i < ECC_NSYM; i++) any |= S[i];

    int pos[4];
    u32 val[4];
    int nf = 0;
    if (any) {
        nf = rs_decode(gf, S, pos, val);
        if (nf < 0) {
            atomicOr(&s_fail, 1);
            nf = 0;
        } else {
            atomicAdd(&s_fixed, nf);
            for (int f = 0; f < nf; f++)
                if (pos[f] < ECC_ROWS) copy[pos[f] * ECC_ROW + c] ^= (u8)val[f];
        }
    }
    __syncthreads();

    // Checksum of the (corrected) copy.
    const u32 *w = reinterpret_cast<const u32 *>(copy);
    u32 s1 = 0, s2 = 0;
    for (u32 i = c; i < ECC_BLOCK / 4; i += 1024u) {
        const u32 x = w[i];
        s1 += x;
        s2 += (2u * i + 1u) * x;
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    if ((c & 31u) == 0) { s_red1[c >> 5] = s1; s_red2[c >> 5] = s2; }
    __syncthreads();
    if (c < 32) {
        s1 = warp_sum(s_red1[c]);
        s2 = warp_sum(s_red2[c]);
        if (c == 0) {
            const uint2 stored = cks[blk];
            const bool match = stored.x == s1 && stored.y == s2;
            u8 st;
            u32 fixed = 0;
            if (s_fail) {
                st = 2;
            } else if (s_fixed == 0) {          // data and parity agree
                if (!match) cks[blk] = make_uint2(s1, s2);   // the checksum was the damage
                st = match ? 0 : 1;
            } else if (match) {
                st = 1;
                fixed = (u32)s_fixed;
                s_apply = 1;
            } else {
                st = 2;                          // a miscorrection: leave the block alone
            }
            out_status[blockIdx.x] = st;
            out_fixed[blockIdx.x] = fixed;
        }
    }
    __syncthreads();
    if (s_apply) {
        for (int f = 0; f < nf; f++) {
            if (pos[f] < ECC_ROWS) d[pos[f] * ECC_ROW + c] = copy[pos[f] * ECC_ROW + c];
            else p[(pos[f] - ECC_ROWS) * ECC_ROW + c] ^= (u8)val[f];
        }
    }
}
