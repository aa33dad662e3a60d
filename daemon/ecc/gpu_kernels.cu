// RS(136,128) codec kernels for gpumemd (layout: ../shared/ECC.md, docs/ecc.md).
//
// Packed bytes: thread t of CUDA block b handles codewords 4t..4t+3 of data block b. Row j
// of those four codewords is one 32-bit word at data[b*131072 + j*1024 + 4t] (a warp reads
// 128 contiguous bytes), and GF(2^8) arithmetic runs on the four byte lanes at once:
// xt() multiplies each lane by x (alpha) modulo 0x11D, and a multiplication by a generator
// coefficient is the XOR of the x^k multiples for the coefficient's set bits. RS_STEP is
// one step of the systematic encoder's shift register (remainder of m(x) x^8 mod g(x)),
// written out by the host from g(x) (cuda_codec.py: rs_step_source), so the constants live
// in one place.

#define BLOCK 131072u
#define ROW_WORDS 256u                  // 1024 codewords = 256 words per message row
#define PARITY_BLOCK 8192u

// Each byte lane times x: shift left, and XOR 0x1d into the lanes whose top bit fell off.
// PRMT with a selector nibble that has its msb set replicates the selected byte's sign bit
// over the whole byte, which turns "top bit set" into a 0xff lane mask in one instruction.
__device__ __forceinline__ unsigned int xt(unsigned int v) {
    unsigned int top;
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(top) : "r"(v));
    return ((v << 1) & 0xfefefefeu) ^ (top & 0x1d1d1d1du);
}

// The macros written out below (cuda_codec.py: hot_loop_macros) define, for GROUPS groups of four
// codewords per thread (words t + k * STRIDE of each row, k < GROUPS: independent
// shift-register chains, so each hides the others' latency):
//   PARITYG(m)  the parity of every group (registers r<k>_<i>), and this thread's share of
//               the block checksum (word i of the block: s1 += w, s2 += (2i+1) w);
//   STOREG(p)   write the parity; DIFFG(p) OR of its differences from the stored parity;
//   THREADS     threads per CUDA block (256 / GROUPS), STRIDE the same.
@HOT_LOOP@
#define WARPS (THREADS / 32)

// Sum s1 and s2 over the CUDA block (THREADS threads); the totals land in thread 0.
__device__ __forceinline__ void block_sum2(unsigned int& s1, unsigned int& s2) {
    __shared__ unsigned int a[WARPS], m[WARPS];
    for (int k = 16; k > 0; k >>= 1) {
        s1 += __shfl_down_sync(0xffffffffu, s1, k);
        s2 += __shfl_down_sync(0xffffffffu, s2, k);
    }
    if ((threadIdx.x & 31) == 0) { a[threadIdx.x >> 5] = s1; m[threadIdx.x >> 5] = s2; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < WARPS; k++) { s1 += a[k]; s2 += m[k]; }
    }
}

// Parity and checksums of nblocks blocks, in one pass over the data.
extern "C" __global__ void rs_encode(const unsigned int* data, unsigned int* parity,
                                     unsigned int* sums, unsigned int nblocks) {
    unsigned long long b = blockIdx.x;
    if (b >= nblocks) return;
    const unsigned int* m = data + b * (BLOCK / 4) + threadIdx.x;
    PARITYG(m);
    unsigned int* p = parity + b * (PARITY_BLOCK / 4) + threadIdx.x;
    STOREG(p);
    block_sum2(s1, s2);
    if (threadIdx.x == 0) { sums[2 * b] = s1; sums[2 * b + 1] = s2; }
}

// One pass: flags[b] bit 0 when a codeword of block b does not match its stored parity (a
// systematic codeword is consistent exactly when its parity re-encodes to itself: all
// syndromes zero), bit 1 when the block's checksum does not match the stored one.
extern "C" __global__ void rs_check(const unsigned int* data, const unsigned int* parity,
                                    const unsigned int* sums, unsigned int* flags,
                                    unsigned int nblocks) {
    unsigned long long b = blockIdx.x;
    if (b >= nblocks) return;
    const unsigned int* m = data + b * (BLOCK / 4) + threadIdx.x;
    PARITYG(m);
    const unsigned int* p = parity + b * (PARITY_BLOCK / 4) + threadIdx.x;
    unsigned int diff = DIFFG(p);
    int bad = __syncthreads_or(diff != 0);
    block_sum2(s1, s2);
    if (threadIdx.x == 0)
        flags[b] = (bad ? 1u : 0u) | ((s1 != sums[2 * b] || s2 != sums[2 * b + 1]) ? 2u : 0u);
}

// The fused verify+refresh pass: like rs_check, and where the block's checksum matches (its
// data is intact) but its parity does not, the parity just computed is written back at
// once. flags[b]: 0 clean, 1 parity refreshed, 2 checksum mismatch (data needs repair).
extern "C" __global__ void rs_check_refresh(const unsigned int* data, unsigned int* parity,
                                            const unsigned int* sums, unsigned int* flags,
                                            unsigned int nblocks) {
    __shared__ int intact;
    unsigned long long b = blockIdx.x;
    if (b >= nblocks) return;
    const unsigned int* m = data + b * (BLOCK / 4) + threadIdx.x;
    PARITYG(m);
    unsigned int* p = parity + b * (PARITY_BLOCK / 4) + threadIdx.x;
    unsigned int diff = DIFFG(p);
    int stale = __syncthreads_or(diff != 0);
    block_sum2(s1, s2);
    if (threadIdx.x == 0) intact = s1 == sums[2 * b] && s2 == sums[2 * b + 1];
    __syncthreads();
    if (intact && stale) {
        STOREG(p);
    }
    if (threadIdx.x == 0) flags[b] = intact ? (stale ? 1u : 0u) : 2u;
}

// ---- the decoder: one thread per codeword of one block (1024 threads), in place --------
// Syndromes, Berlekamp-Massey, Chien search over the shortened positions 0..135, Forney
// (fcr = 1). result[c]: the number of symbols corrected (0: clean), or -1 when the codeword
// cannot be decoded (more than 4 errors): the caller then leaves the whole block as it was.
// Only rare damaged blocks come here (on a scratch copy), so plain table arithmetic will do.
__constant__ unsigned char GF_EXP[512] = { GF_EXP_TABLE };
__constant__ unsigned char GF_LOG[256] = { GF_LOG_TABLE };

__device__ __forceinline__ unsigned char gmul(unsigned char a, unsigned char b) {
    return (a && b) ? GF_EXP[GF_LOG[a] + GF_LOG[b]] : 0;
}
__device__ __forceinline__ unsigned char ginv(unsigned char a) {
    return GF_EXP[255 - GF_LOG[a]];
}

extern "C" __global__ void rs_decode(unsigned char* data, unsigned char* parity, int* result) {
    unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= 1024) return;
    unsigned char S[8];
    bool any = false;
    for (int i = 0; i < 8; i++) {
        unsigned char a = GF_EXP[i + 1], s = 0;
        for (int k = 0; k < 136; k++)
            s = gmul(s, a) ^ (k < 128 ? data[k * 1024 + c] : parity[(k - 128) * 1024 + c]);
        S[i] = s;
        any |= s != 0;
    }
    if (!any) { result[c] = 0; return; }
    unsigned char lam[9] = {1, 0, 0, 0, 0, 0, 0, 0, 0}, B[9] = {1, 0, 0, 0, 0, 0, 0, 0, 0};
    int L = 0, m = 1;
    unsigned char b = 1;
    for (int n = 0; n < 8; n++) {
        unsigned char d = S[n];
        for (int i = 1; i <= L; i++) d ^= gmul(lam[i], S[n - i]);
        if (d == 0) { m++; continue; }
        unsigned char coef = gmul(d, ginv(b)), T[9];
        for (int i = 0; i < 9; i++) T[i] = lam[i];
        for (int i = m; i < 9; i++) lam[i] ^= gmul(coef, B[i - m]);
        if (2 * L <= n) {
            L = n + 1 - L;
            for (int i = 0; i < 9; i++) B[i] = T[i];
            b = d;
            m = 1;
        } else {
            m++;
        }
    }
    if (L > 4) { result[c] = -1; return; }
    int found = 0, pos[4];
    unsigned char xinv[4];
    for (int k = 0; k < 136; k++) {
        unsigned char x = GF_EXP[(255 - (135 - k) % 255) % 255], v = 0;   // alpha^-(135-k)
        for (int i = L; i >= 0; i--) v = gmul(v, x) ^ lam[i];
        if (v == 0) {
            if (found < 4) { pos[found] = k; xinv[found] = x; }
            found++;
        }
    }
    if (found != L) { result[c] = -1; return; }
    unsigned char om[8];
    for (int i = 0; i < 8; i++) {
        om[i] = 0;
        for (int j = 0; j <= i && j <= L; j++) om[i] ^= gmul(lam[j], S[i - j]);
    }
    unsigned char e[4];
    for (int r = 0; r < L; r++) {
        unsigned char x = xinv[r], num = 0, den = 0, xp = 1, x2 = gmul(x, x);
        for (int i = 7; i >= 0; i--) num = gmul(num, x) ^ om[i];
        for (int i = 1; i <= L; i += 2) { den ^= gmul(lam[i], xp); xp = gmul(xp, x2); }
        if (den == 0) { result[c] = -1; return; }
        e[r] = gmul(num, ginv(den));
    }
    for (int r = 0; r < L; r++) {
        int k = pos[r];
        if (k < 128) data[k * 1024 + c] ^= e[r];
        else parity[(k - 128) * 1024 + c] ^= e[r];
    }
    result[c] = L;
}
