// ---------------------------------------------------------------------------------------
// MMQ: prompt matmuls straight on the quantized weights, with int8 tensor cores. This file is
// appended to damascus.cu and gemv.cu before NVRTC compiles it (gpu.rs `SOURCE`): it uses
// their types, FMT_* layouts and helpers (h2f, ld128, ld32, scale_min_k4, spread4).
//
// out[t, r] (+)= sum_k W[r, k] * x[t, k]: W one weight matrix [rows, cols] in its device
// layout, x the q8 shadow of the activations (xq int8 [n_tok, cols], xds float2
// [n_tok, cols / 32] = (d, d * sum q) per 32-block), out f32 row-major [n_tok, rows].
// Requires rows % 32 == 0 (checked on the host) and cols a whole number of the format's blocks.
//
// Design
// * A block of MMQ_THREADS = 128 threads (4 warps, 2 x 2) computes a tile of MMQ_TOK = 64 tokens
//   x MMQ_ROWS = 64 weight rows; a warp owns 32 tokens x 32 rows = 2 x 4 mma tiles of 16 x 8,
//   32 f32 accumulators per thread. Grid (ceil(rows / 64), ceil(n_tok / 64)); rows and tokens
//   past the end are staged as zeros and never stored.
// * The K loop walks stages of 256 columns (one K-quant super-block, eight 32-blocks). Each
//   stage stages the activations (64 x 256 int8 + their 64 x 8 (d, d * sum q)) and the weights,
//   unpacked to int8 (64 x 256) plus two floats per row and 32-block, in shared memory; then
//   every 32-block j is one mma.sync m16n8k32 s8 x s8 -> s32 per 16 x 8 tile. The MMA's A is
//   the activations (M = tokens, row-major: a token's k contiguous), B the weights
//   (N = rows, "col": a row's k contiguous), so C [token, row] lands in out's own layout and
//   each thread's c0, c1 are two adjacent rows of one token (one float2 store).
// * Scales. A 32-block of a weight row is W = s0 * q + s1 with q int8, and x = dx * qx, so
//   sum W x = s0 * dx * sum(q qx) + s1 * (dx * sum qx) = s0 * dx * I + s1 * xds.y:
//     Q4_K  q = nibble (0..15)        s0 = d * sc_j   s1 = -dmin * m_j
//     Q4_1  q = nibble                s0 = d          s1 = m
//     Q5_0  q = 5-bit value (0..31)   s0 = d          s1 = -16 * d
//     Q8_0  q = qs                    s0 = d          s1 = 0
//   Q6_K has a scale per 16 weights: q - 32 (fits s8) is staged, each 32-block is two
//   m16n8k16 MMAs (one per 16-half) and s0, s1 are the halves' scales d * sc: the sum is
//   dx * (s0 * I_lo + s1 * I_hi). The int32 results are scaled and added into the f32
//   accumulators per 32-block.
// * Shared layout. Within each staged 32-block the eight 4-byte chunks are interleaved
//   (chunk c at word 2 * (c & 3) + (c >> 2)), so the words a thread's fragments need (chunks t
//   and t + 4: k = 4t.. and 16 + 4t.., PTX ISA "Matrix Fragments for mma.m16n8k32") are one
//   8-byte load; for Q6_K chunk t is the first 16-half's fragment and t + 4 the second's. Rows
//   are padded to 72 words, which puts the 8-byte loads of a half-warp on distinct banks.

#define MMQ_ROWS 64
#define MMQ_TOK 64
#define MMQ_THREADS 128
#define MMQ_STRIDE 72  // u32 words per staged row: 256 bytes of int8 + 32 of padding

struct MmqTile {
    u32 x[MMQ_TOK * MMQ_STRIDE];   // [token][256] int8 activations of the stage, interleaved
    u32 w[MMQ_ROWS * MMQ_STRIDE];  // [row][256] int8 weights of the stage, interleaved
    float2 xd[8][MMQ_TOK];         // [32-block][token] (d, d * sum q) of the activations
    float s0[8][MMQ_ROWS];         // [32-block][row] weight scale (Q6_K: of the first 16)
    float s1[8][MMQ_ROWS];         // [32-block][row] offset per unit of x (Q6_K: 2nd scale)
};

// D (+)= A * B, m16n8k32, s8 inputs, s32 accumulators.
__device__ __forceinline__ void mma_k32(int* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                        u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D (+)= A * B, m16n8k16, s8 inputs, s32 accumulators.
__device__ __forceinline__ void mma_k16(int* d, u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Stores one 32-block given as its eight chunks (elements 4c..4c+3 in c[c]) interleaved.
__device__ __forceinline__ void mmq_put32(u32* dst, const u32* c) {
    *(uint4*)dst = make_uint4(c[0], c[4], c[1], c[5]);
    *(uint4*)(dst + 4) = make_uint4(c[2], c[6], c[3], c[7]);
}

// Stages 32-blocks blk0..blk0+7 of tokens tok0..tok0+63 (zeros past n_tok or nblk).
__device__ __forceinline__ void mmq_stage_x(MmqTile& s, const i8* xq, const float2* xds,
                                            int n_tok, int nblk, int tok0, int blk0) {
#pragma unroll
    for (int k = 0; k < MMQ_TOK * 8 / MMQ_THREADS; k++) {
        int p = threadIdx.x + k * MMQ_THREADS;
        int i = p >> 3, j = p & 7;
        int tok = tok0 + i, b = blk0 + j;
        u32 c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float2 d = make_float2(0.0f, 0.0f);
        if (tok < n_tok && b < nblk) {
            u64 blk = (u64)tok * nblk + b;
            uint4 lo = ld128((const u8*)xq + blk * 32), hi = ld128((const u8*)xq + blk * 32 + 16);
            c[0] = lo.x, c[1] = lo.y, c[2] = lo.z, c[3] = lo.w;
            c[4] = hi.x, c[5] = hi.y, c[6] = hi.z, c[7] = hi.w;
            d = xds[blk];
        }
        mmq_put32(s.x + i * MMQ_STRIDE + 8 * j, c);
        s.xd[j][i] = d;
    }
}

// Stages the weights of rows row0..row0+63, 32-blocks blk0..blk0+7, as int8 plus (s0, s1)
// (zeros past rows or nblk).
template <int FMT>
__device__ __forceinline__ void mmq_stage_w(MmqTile& s, const u8* w, u64 off1, u64 off2,
                                            int rows, int nblk, int row0, int blk0) {
    if (FMT == FMT_Q4K) {
        // Thread unit (row i, part): 16 bytes of qs = elements 16 * (part & 1).. of sub-blocks
        // 2 * (part >> 1) (low nibbles) and 2 * (part >> 1) + 1 (high), plus sub-block part's
        // scale and min.
        u64 nb = nblk >> 3;
        int sb = blk0 >> 3;
#pragma unroll
        for (int k = 0; k < MMQ_ROWS * 8 / MMQ_THREADS; k++) {
            int p = threadIdx.x + k * MMQ_THREADS;
            int i = p >> 3, part = p & 7;
            int row = row0 + i;
            uint4 q = make_uint4(0, 0, 0, 0);
            float a = 0.0f, b = 0.0f;
            if (row < rows) {
                const u8* B = w + ((u64)row * nb + sb) * 144;
                q = ld128(B + 16 + 16 * part);
                float d = h2f(*(const u16*)B), dmin = h2f(*(const u16*)(B + 2));
                int sc, m;
                scale_min_k4(part, B + 4, &sc, &m);
                a = d * (float)sc;
                b = -dmin * (float)m;
            }
            s.s0[part][i] = a;
            s.s1[part][i] = b;
            // Chunk 4 * (part & 1) + c of the sub-block sits at word 2 * c + (part & 1).
            u32* lo = s.w + i * MMQ_STRIDE + 16 * (part >> 1) + (part & 1);
            u32 qw[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int c = 0; c < 4; c++) {
                lo[2 * c] = qw[c] & 0x0F0F0F0Fu;
                lo[8 + 2 * c] = (qw[c] >> 4) & 0x0F0F0F0Fu;
            }
        }
    } else if (FMT == FMT_Q6K) {
        u64 nb = nblk >> 3;
        int sb = blk0 >> 3;
        // Thread unit (row i, half n, lh): weights l = 16 * lh.. of the 32-blocks 4n..4n+3
        // (element 128n + 32k + l: ql byte 64n + 32 (k & 1) + l, nibble k >> 1; qh byte
        // 32n + l, bits 2k), staged as q - 32.
#pragma unroll
        for (int k = 0; k < MMQ_ROWS * 4 / MMQ_THREADS; k++) {
            int p = threadIdx.x + k * MMQ_THREADS;
            int i = p >> 2, n = (p >> 1) & 1, lh = p & 1;
            int row = row0 + i;
            uint4 a4 = make_uint4(0, 0, 0, 0), b4 = a4, h4 = a4;
            if (row < rows) {
                const u8* qlh = w + ((u64)row * nb + sb) * 192;
                a4 = ld128(qlh + 64 * n + 16 * lh);
                b4 = ld128(qlh + 64 * n + 32 + 16 * lh);
                h4 = ld128(qlh + 128 + 32 * n + 16 * lh);
            }
            u32 aw[4] = {a4.x, a4.y, a4.z, a4.w};
            u32 bw[4] = {b4.x, b4.y, b4.z, b4.w};
            u32 hw[4] = {h4.x, h4.y, h4.z, h4.w};
            u32* dst = s.w + i * MMQ_STRIDE + 32 * n + lh;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                u32 q[4];
                q[0] = (aw[c] & 0x0F0F0F0Fu) | ((hw[c] << 4) & 0x30303030u);
                q[1] = (bw[c] & 0x0F0F0F0Fu) | ((hw[c] << 2) & 0x30303030u);
                q[2] = ((aw[c] >> 4) & 0x0F0F0F0Fu) | (hw[c] & 0x30303030u);
                q[3] = ((bw[c] >> 4) & 0x0F0F0F0Fu) | ((hw[c] >> 2) & 0x30303030u);
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    // Bytes 0..63 minus 32 without borrows: (q + 128 - 32) ^ 128.
                    u32 v = row < rows ? ((q[kk] | 0x80808080u) - 0x20202020u) ^ 0x80808080u : 0u;
                    dst[8 * kk + 2 * c] = v;
                }
            }
        }
        // Scales: (row i, 32-block j) -> d * sc[2j], d * sc[2j + 1].
#pragma unroll
        for (int k = 0; k < MMQ_ROWS * 8 / MMQ_THREADS; k++) {
            int p = threadIdx.x + k * MMQ_THREADS;
            int i = p >> 3, j = p & 7;
            int row = row0 + i;
            float a = 0.0f, b = 0.0f;
            if (row < rows) {
                u64 blk = (u64)row * nb + sb;
                const i8* scs = (const i8*)(w + off1 + blk * 16);
                float d = h2f(((const u16*)(w + off2))[blk]);
                a = d * (float)scs[2 * j];
                b = d * (float)scs[2 * j + 1];
            }
            s.s0[j][i] = a;
            s.s1[j][i] = b;
        }
    } else {
        // 32-block formats: thread unit (row i, 32-block j).
#pragma unroll
        for (int k = 0; k < MMQ_ROWS * 8 / MMQ_THREADS; k++) {
            int p = threadIdx.x + k * MMQ_THREADS;
            int i = p >> 3, j = p & 7;
            int row = row0 + i, b = blk0 + j;
            u32 c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            float a = 0.0f, o = 0.0f;
            if (row < rows && b < nblk) {
                u64 blk = (u64)row * nblk + b;
                if (FMT == FMT_Q80) {
                    uint4 lo = ld128(w + blk * 32), hi = ld128(w + blk * 32 + 16);
                    c[0] = lo.x, c[1] = lo.y, c[2] = lo.z, c[3] = lo.w;
                    c[4] = hi.x, c[5] = hi.y, c[6] = hi.z, c[7] = hi.w;
                    a = h2f(((const u16*)(w + off1))[blk]);
                } else if (FMT == FMT_Q41) {
                    const u8* B = w + blk * 20;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        u32 v = ld32(B + 4 + 4 * q);
                        c[q] = v & 0x0F0F0F0Fu;
                        c[q + 4] = (v >> 4) & 0x0F0F0F0Fu;
                    }
                    a = h2f(*(const u16*)B);
                    o = h2f(*(const u16*)(B + 2));
                } else {  // FMT_Q50
                    uint4 q4 = ld128(w + blk * 16);
                    u32 qw[4] = {q4.x, q4.y, q4.z, q4.w};
                    u32 qh = ((const u32*)(w + off1))[blk];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        c[q] = (qw[q] & 0x0F0F0F0Fu) | spread4((qh >> (4 * q)) & 0xF);
                        c[q + 4] = ((qw[q] >> 4) & 0x0F0F0F0Fu) | spread4((qh >> (16 + 4 * q)) & 0xF);
                    }
                    a = h2f(((const u16*)(w + off2))[blk]);
                    o = -16.0f * a;
                }
            }
            mmq_put32(s.w + i * MMQ_STRIDE + 8 * j, c);
            s.s0[j][i] = a;
            s.s1[j][i] = o;
        }
    }
}

template <int FMT>
__device__ __forceinline__ void mmq(const u8* w, u64 off1, u64 off2, int rows, int cols,
                                    const i8* xq, const float2* xds, float* out, int n_tok,
                                    int acc) {
    __shared__ __align__(16) MmqTile s;
    int nblk = cols >> 5;
    int row0 = blockIdx.x * MMQ_ROWS, tok0 = blockIdx.y * MMQ_TOK;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;  // the mma fragments' groupID and threadID_in_group
    int wt = (warp >> 1) * 32;        // the warp's tokens wt..wt+31 of the tile
    int wr = (warp & 1) * 32;         // and its rows wr..wr+31
    // c[mi][ni][e]: token wt + 16 mi + g + 8 (e >> 1), row wr + 8 ni + 2t + (e & 1).
    float c[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) c[mi][ni][e] = 0.0f;

    for (int blk0 = 0; blk0 < nblk; blk0 += 8) {
        __syncthreads();  // the previous stage is consumed
        mmq_stage_x(s, xq, xds, n_tok, nblk, tok0, blk0);
        mmq_stage_w<FMT>(s, w, off1, off2, rows, nblk, row0, blk0);
        __syncthreads();
#pragma unroll 2
        for (int j = 0; j < 8; j++) {
            // a[mi][h]: token wt + 16 mi + 8 h + g, chunks t (.x) and t + 4 (.y) of block j.
            uint2 a[2][2], b[4];
            float2 dx[2][2], s0[4], s1[4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int tk = wt + 16 * mi + 8 * h + g;
                    a[mi][h] = *(const uint2*)(s.x + tk * MMQ_STRIDE + 8 * j + 2 * t);
                    dx[mi][h] = s.xd[j][tk];
                }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                b[ni] = *(const uint2*)(s.w + (wr + 8 * ni + g) * MMQ_STRIDE + 8 * j + 2 * t);
                s0[ni] = *(const float2*)&s.s0[j][wr + 8 * ni + 2 * t];
                s1[ni] = *(const float2*)&s.s1[j][wr + 8 * ni + 2 * t];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    if (FMT == FMT_Q6K) {
                        int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                        mma_k16(lo, a[mi][0].x, a[mi][1].x, b[ni].x);
                        mma_k16(hi, a[mi][0].y, a[mi][1].y, b[ni].y);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float sa = e & 1 ? s0[ni].y : s0[ni].x;
                            float sb = e & 1 ? s1[ni].y : s1[ni].x;
                            float v = (float)lo[e] * sa + (float)hi[e] * sb;
                            c[mi][ni][e] += v * dx[mi][e >> 1].x;
                        }
                    } else {
                        int q[4] = {0, 0, 0, 0};
                        mma_k32(q, a[mi][0].x, a[mi][1].x, a[mi][0].y, a[mi][1].y, b[ni].x,
                                b[ni].y);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float sa = e & 1 ? s0[ni].y : s0[ni].x;
                            float2 d = dx[mi][e >> 1];
                            float v = c[mi][ni][e] + (float)q[e] * (sa * d.x);
                            if (FMT != FMT_Q80) v += (e & 1 ? s1[ni].y : s1[ni].x) * d.y;
                            c[mi][ni][e] = v;
                        }
                    }
                }
        }
    }

#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int tok = tok0 + wt + 16 * mi + 8 * h + g;
                int row = row0 + wr + 8 * ni + 2 * t;
                if (tok < n_tok && row < rows) {
                    float2* o = (float2*)(out + (u64)tok * rows + row);
                    float2 v = make_float2(c[mi][ni][2 * h], c[mi][ni][2 * h + 1]);
                    if (acc) {
                        float2 prev = *o;
                        v.x += prev.x;
                        v.y += prev.y;
                    }
                    *o = v;
                }
            }
}

#define MMQ_INSTANTIATE(NAME, FMT)                                                             \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS)                                  \
        mmq_##NAME(const u8* w, u64 off1, u64 off2, int rows, int cols, const i8* xq,          \
                   const float2* xds, float* out, int n_tok, int acc) {                        \
        mmq<FMT>(w, off1, off2, rows, cols, xq, xds, out, n_tok, acc);                         \
    }

MMQ_INSTANTIATE(q4k, FMT_Q4K)
MMQ_INSTANTIATE(q41, FMT_Q41)
MMQ_INSTANTIATE(q80, FMT_Q80)
MMQ_INSTANTIATE(q50, FMT_Q50)
MMQ_INSTANTIATE(q6k, FMT_Q6K)
