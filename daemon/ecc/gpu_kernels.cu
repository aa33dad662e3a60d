// RS(136,128) codec kernels for gpumemd (layout: ../shared/ECC.md, docs/ecc.md).
// One thread per codeword: codeword c of block b takes message byte j from
// data[b*131072 + j*1024 + c], so consecutive threads read consecutive bytes (coalesced).
// GT[i][v] = g_{i+1} * v in GF(2^8) (0x11D), g(x) = x^8 + g_1 x^7 + ... + g_8, filled in by
// the host from the generator polynomial (gpu.py) before compilation.

#define BLOCK 131072u
#define CODEWORDS 1024u
#define PARITY_BLOCK 8192u

__constant__ unsigned char GT[8][256] = { GT_TABLE };

__device__ __forceinline__ void parity_of(const unsigned char* m, unsigned char r[8],
                                          const unsigned char (*gt)[256]) {
    #pragma unroll
    for (int i = 0; i < 8; i++) r[i] = 0;
    #pragma unroll 4
    for (unsigned int j = 0; j < 128; j++) {
        unsigned char fb = m[j * CODEWORDS] ^ r[0];
        #pragma unroll
        for (int i = 0; i < 7; i++) r[i] = r[i + 1] ^ gt[i][fb];
        r[7] = gt[7][fb];
    }
}

__device__ __forceinline__ void load_table(unsigned char (*gt)[256]) {
    for (unsigned int i = threadIdx.x; i < 8 * 256; i += blockDim.x)
        gt[i / 256][i % 256] = GT[i / 256][i % 256];
    __syncthreads();
}

extern "C" __global__ void rs_encode(const unsigned char* data, unsigned char* parity,
                                     unsigned int nblocks) {
    __shared__ unsigned char gt[8][256];
    load_table(gt);
    unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (unsigned long long)nblocks * CODEWORDS) return;
    unsigned long long b = gid / CODEWORDS;
    unsigned int c = gid % CODEWORDS;
    unsigned char r[8];
    parity_of(data + b * BLOCK + c, r, gt);
    #pragma unroll
    for (int i = 0; i < 8; i++) parity[b * PARITY_BLOCK + i * CODEWORDS + c] = r[i];
}

// flags[b] |= 1 when any codeword of block b does not match its stored parity.
extern "C" __global__ void rs_check(const unsigned char* data, const unsigned char* parity,
                                    unsigned int* flags, unsigned int nblocks) {
    __shared__ unsigned char gt[8][256];
    load_table(gt);
    unsigned long long gid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (unsigned long long)nblocks * CODEWORDS) return;
    unsigned long long b = gid / CODEWORDS;
    unsigned int c = gid % CODEWORDS;
    unsigned char r[8];
    parity_of(data + b * BLOCK + c, r, gt);
    bool bad = false;
    #pragma unroll
    for (int i = 0; i < 8; i++) bad |= parity[b * PARITY_BLOCK + i * CODEWORDS + c] != r[i];
    if (bad) atomicOr(&flags[b], 1u);
}

// The block checksum (docs/ecc.md): s1 = sum w_i, s2 = sum (2i+1) w_i, mod 2^32, over the
// block's 32768 little-endian words. One CUDA block of 256 threads per data block.
extern "C" __global__ void block_sums(const unsigned int* data, unsigned int* out,
                                      unsigned int nblocks) {
    __shared__ unsigned int a[256], m[256];
    unsigned long long b = blockIdx.x;
    if (b >= nblocks) return;
    const unsigned int* w = data + b * (BLOCK / 4);
    unsigned int s1 = 0, s2 = 0;
    for (unsigned int i = threadIdx.x; i < BLOCK / 4; i += blockDim.x) {
        unsigned int v = w[i];
        s1 += v;
        s2 += (2u * i + 1u) * v;
    }
    a[threadIdx.x] = s1;
    m[threadIdx.x] = s2;
    __syncthreads();
    for (unsigned int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            a[threadIdx.x] += a[threadIdx.x + k];
            m[threadIdx.x] += m[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[2 * b] = a[0];
        out[2 * b + 1] = m[0];
    }
}
