// Damascus CUDA kernels, part 2 (concatenated after damascus.cu, whose types, FMT_* layouts,
// PDL macros and helpers it uses): dequantization and the one-token GEMVs (with the weight
// prefetch before the PDL wait and the fused gate/up activation). mmq.cu and gemv_batch.cu use
// its device functions.

// ---------------------------------------------------------------------------------------
// Dequantization: group g (32 weights) of row `row`.

__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

template <int FMT>
__device__ void deq32(const u8* w, u64 off1, u64 off2, u64 row, int g, int cols, float* o) {
    if (FMT == FMT_Q4K) {
        u64 nb = cols >> 8;
        const u8* B = w + (row * nb + (g >> 3)) * 144;
        int s = g & 7;
        float d = h2f(*(const u16*)B), dmin = h2f(*(const u16*)(B + 2));
        int sc, m;
        scale_min_k4(s, B + 4, &sc, &m);
        float dl = d * (float)sc, ml = dmin * (float)m;
        const u8* qs = B + 16 + 32 * (s >> 1);
        int sh = (s & 1) * 4;
        for (int l = 0; l < 32; l++) o[l] = dl * (float)((qs[l] >> sh) & 0xF) - ml;
    } else if (FMT == FMT_Q41) {
        u64 nb = cols >> 5;
        const u8* B = w + (row * nb + g) * 20;
        float d = h2f(*(const u16*)B), m = h2f(*(const u16*)(B + 2));
        for (int j = 0; j < 16; j++) {
            o[j] = d * (float)(B[4 + j] & 0xF) + m;
            o[j + 16] = d * (float)(B[4 + j] >> 4) + m;
        }
    } else if (FMT == FMT_Q80) {
        u64 blk = row * (cols >> 5) + g;
        const i8* qs = (const i8*)(w + blk * 32);
        float d = h2f(((const u16*)(w + off1))[blk]);
        for (int j = 0; j < 32; j++) o[j] = d * (float)qs[j];
    } else if (FMT == FMT_Q50) {
        u64 blk = row * (cols >> 5) + g;
        const u8* qs = w + blk * 16;
        u32 qh = ((const u32*)(w + off1))[blk];
        float d = h2f(((const u16*)(w + off2))[blk]);
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            o[j] = d * (float)(lo - 16);
            o[j + 16] = d * (float)(hi - 16);
        }
    } else if (FMT == FMT_Q6K) {
        u64 blk = row * (cols >> 8) + (g >> 3);
        const u8* qlh = w + blk * 192;
        const i8* scs = (const i8*)(w + off1 + blk * 16);
        float d = h2f(((const u16*)(w + off2))[blk]);
        int s = g & 7, n = s >> 2, k = s & 3;
        const u8* ql = qlh + 64 * n + 32 * (k & 1);
        const u8* qh = qlh + 128 + 32 * n;
        int sh = k < 2 ? 0 : 4;
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l] >> sh) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
            o[l] = d * (float)scs[8 * n + 2 * k + (l >> 4)] * (float)(q - 32);
        }
    } else {
        const u16* p = (const u16*)w + row * (u64)cols + g * 32;
        for (int j = 0; j < 32; j++) o[j] = h2f(p[j]);
    }
}

// Dequantizes rows of w into out_f32 [n_out, cols] and/or out_bf16 [n_out, cols]. Output row r
// is weight row ids[r] when ids is given (embedding lookup; ids = inputs + 1), else row r.
// Token ids are checked on the host; a row past `rows` is written as zeros, never read.
template <int FMT>
__device__ void dequant_rows(const u8* w, u64 off1, u64 off2, int rows, int cols,
                             const u32* ids, float* out_f32, u16* out_bf16) {
    u64 r = blockIdx.x;
    u64 row = ids ? (u64)ids[r] : r;
    float o[32];
    for (int g = threadIdx.x; g < (cols >> 5); g += blockDim.x) {
        if (row < (u64)rows) {
            deq32<FMT>(w, off1, off2, row, g, cols, o);
        } else {
            for (int j = 0; j < 32; j++) o[j] = 0.0f;
        }
        u64 base = r * cols + g * 32;
        if (out_f32)
            for (int j = 0; j < 32; j++) out_f32[base + j] = o[j];
        if (out_bf16)
            for (int j = 0; j < 32; j++) out_bf16[base + j] = f2bf(o[j]);
    }
}

// ---------------------------------------------------------------------------------------
// GEMV: out[t, row] = sum_c W[row, c] * x[t, c]. One warp per row, 4 rows per block, blocks
// (row block, token) flattened token-fastest on x. Each lane takes "units" (a fixed slice of
// the row's blocks) in turn; quantized formats use dp4a against the q8 shadow, f16 uses the
// f32 activations.

// A unit is 16 bytes of quants: 16 weights of sub-block 2j and 16 of 2j + 1 (half h of each).
// The min term needs the sum of x over a whole 32-block, which the q8 shadow carries (ds.y =
// d * sum q): the h = 0 lane of a pair adds it for both halves.
__device__ __forceinline__ float unit_q4k(const u8* w, u64 row, int u, int cols, const i8* xq,
                                          const float2* xds) {
    u64 nb = cols >> 8;
    int sb = u >> 3, p = u & 7, j = p >> 1, h = p & 1;
    const u8* B = w + (row * nb + sb) * 144;
    float d = h2f(*(const u16*)B), dmin = h2f(*(const u16*)(B + 2));
    int sc1, m1, sc2, m2;
    scale_min_k4(2 * j, B + 4, &sc1, &m1);
    scale_min_k4(2 * j + 1, B + 4, &sc2, &m2);
    uint4 q = ld128(B + 16 + 32 * j + 16 * h);
    const u8* xb = (const u8*)xq + sb * 256 + 64 * j + 16 * h;
    uint4 xl = ld128(xb), xh = ld128(xb + 32);
    u32 qw[4] = {q.x, q.y, q.z, q.w};
    int xlw[4] = {(int)xl.x, (int)xl.y, (int)xl.z, (int)xl.w};
    int xhw[4] = {(int)xh.x, (int)xh.y, (int)xh.z, (int)xh.w};
    int dl = 0, dh = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        dl = dp4a((int)(qw[k] & 0x0F0F0F0Fu), xlw[k], dl);
        dh = dp4a((int)((qw[k] >> 4) & 0x0F0F0F0Fu), xhw[k], dh);
    }
    float2 dsl = xds[sb * 8 + 2 * j], dsh = xds[sb * 8 + 2 * j + 1];
    float mins = dmin * ((float)m1 * dsl.y + (float)m2 * dsh.y);
    return d * ((float)sc1 * dsl.x * (float)dl + (float)sc2 * dsh.x * (float)dh) -
           (h ? 0.0f : mins);
}

__device__ __forceinline__ float unit_q6k(const u8* w, u64 off1, u64 off2, u64 row, int u,
                                          int cols, const i8* xq, const float2* xds) {
    u64 nb = cols >> 8;
    int sb = u >> 2, p = u & 3, n = p >> 1, ih = p & 1;
    u64 blk = row * nb + sb;
    const u8* qlh = w + blk * 192;
    const i8* scs = (const i8*)(w + off1 + blk * 16);
    float d = h2f(((const u16*)(w + off2))[blk]);
    uint4 a4 = ld128(qlh + 64 * n + 16 * ih);
    uint4 b4 = ld128(qlh + 64 * n + 32 + 16 * ih);
    uint4 h4 = ld128(qlh + 128 + 32 * n + 16 * ih);
    u32 aw[4] = {a4.x, a4.y, a4.z, a4.w};
    u32 bw[4] = {b4.x, b4.y, b4.z, b4.w};
    u32 hw[4] = {h4.x, h4.y, h4.z, h4.w};
    const u8* xb = (const u8*)xq + sb * 256 + 128 * n + 16 * ih;
    u32 xw[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint4 v = ld128(xb + 32 * k);
        xw[k][0] = v.x, xw[k][1] = v.y, xw[k][2] = v.z, xw[k][3] = v.w;
    }
    // Scales 8n + ih + 2k (k = 0..3): bytes ih, ih + 2 of each of two words.
    const u8* sp = (const u8*)scs + 8 * n;
    u32 s_lo = ld32(sp), s_hi = ld32(sp + 4);
    int dot[4] = {0, 0, 0, 0}, sum[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 qk[4];
        qk[0] = (aw[i] & 0x0F0F0F0Fu) | ((hw[i] << 4) & 0x30303030u);
        qk[1] = (bw[i] & 0x0F0F0F0Fu) | ((hw[i] << 2) & 0x30303030u);
        qk[2] = ((aw[i] >> 4) & 0x0F0F0F0Fu) | (hw[i] & 0x30303030u);
        qk[3] = ((bw[i] >> 4) & 0x0F0F0F0Fu) | ((hw[i] >> 2) & 0x30303030u);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int xv = (int)xw[k][i];
            dot[k] = dp4a((int)qk[k], xv, dot[k]);
            sum[k] = dp4a(0x01010101, xv, sum[k]);
        }
    }
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float dx = xds[sb * 8 + 4 * n + k].x;
        u32 word = k < 2 ? s_lo : s_hi;
        int sc = (int)(i8)((word >> (8 * (ih + 2 * (k & 1)))) & 0xFF);
        acc += (float)sc * dx * (float)(dot[k] - 32 * sum[k]);
    }
    return d * acc;
}

__device__ __forceinline__ float unit_q80(const u8* w, u64 off1, u64 row, int u, int cols,
                                          const i8* xq, const float2* xds) {
    u64 blk = row * (cols >> 5) + u;
    const u8* qs = w + blk * 32;
    float d = h2f(((const u16*)(w + off1))[blk]);
    const u8* xb = (const u8*)xq + u * 32;
    int acc = 0;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        uint4 q = ld128(qs + 16 * k), x = ld128(xb + 16 * k);
        acc = dp4a((int)q.x, (int)x.x, acc);
        acc = dp4a((int)q.y, (int)x.y, acc);
        acc = dp4a((int)q.z, (int)x.z, acc);
        acc = dp4a((int)q.w, (int)x.w, acc);
    }
    return d * xds[u].x * (float)acc;
}

__device__ __forceinline__ float unit_q41(const u8* w, u64 row, int u, int cols, const i8* xq,
                                          const float2* xds) {
    const u8* B = w + (row * (cols >> 5) + u) * 20;
    float d = h2f(*(const u16*)B), m = h2f(*(const u16*)(B + 2));
    const u8* xb = (const u8*)xq + u * 32;
    uint4 xl = ld128(xb), xh = ld128(xb + 16);
    int xlw[4] = {(int)xl.x, (int)xl.y, (int)xl.z, (int)xl.w};
    int xhw[4] = {(int)xh.x, (int)xh.y, (int)xh.z, (int)xh.w};
    int acc = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 q = ld32(B + 4 + 4 * k);
        acc = dp4a((int)(q & 0x0F0F0F0Fu), xlw[k], acc);
        acc = dp4a((int)((q >> 4) & 0x0F0F0F0Fu), xhw[k], acc);
    }
    float2 ds = xds[u];
    return d * ds.x * (float)acc + m * ds.y;
}

__device__ __forceinline__ u32 spread4(u32 b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

__device__ __forceinline__ float unit_q50(const u8* w, u64 off1, u64 off2, u64 row, int u,
                                          int cols, const i8* xq, const float2* xds) {
    u64 blk = row * (cols >> 5) + u;
    uint4 q4 = ld128(w + blk * 16);
    u32 qw[4] = {q4.x, q4.y, q4.z, q4.w};
    u32 qh = ((const u32*)(w + off1))[blk];
    float d = h2f(((const u16*)(w + off2))[blk]);
    const u8* xb = (const u8*)xq + u * 32;
    uint4 xl = ld128(xb), xh = ld128(xb + 16);
    int xlw[4] = {(int)xl.x, (int)xl.y, (int)xl.z, (int)xl.w};
    int xhw[4] = {(int)xh.x, (int)xh.y, (int)xh.z, (int)xh.w};
    int acc = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 lo = (qw[k] & 0x0F0F0F0Fu) | spread4((qh >> (4 * k)) & 0xF);
        u32 hi = ((qw[k] >> 4) & 0x0F0F0F0Fu) | spread4((qh >> (16 + 4 * k)) & 0xF);
        acc = dp4a((int)lo, xlw[k], acc);
        acc = dp4a((int)hi, xhw[k], acc);
    }
    float2 ds = xds[u];
    return d * (ds.x * (float)acc - 16.0f * ds.y);
}

__device__ __forceinline__ float unit_f16(const u8* w, u64 row, int u, int cols,
                                          const float* xf) {
    const u8* p = w + (row * (u64)cols + u * 32) * 2;
    const float* x = xf + u * 32;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint4 v = ld128(p + 16 * k);
        u32 vw[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc += h2f((u16)(vw[i] & 0xFFFF)) * x[8 * k + 2 * i];
            acc += h2f((u16)(vw[i] >> 16)) * x[8 * k + 2 * i + 1];
        }
    }
    return acc;
}

template <int FMT>
__device__ __forceinline__ int units_per_row(int cols) {
    if (FMT == FMT_Q4K) return (cols >> 8) * 8;
    if (FMT == FMT_Q6K) return (cols >> 8) * 4;
    return cols >> 5;
}

template <int FMT>
__device__ __forceinline__ float unit(const u8* w, u64 off1, u64 off2, u64 row, int u, int cols,
                                      const i8* xq, const float2* xds, const float* xf) {
    if (FMT == FMT_Q4K) return unit_q4k(w, row, u, cols, xq, xds);
    if (FMT == FMT_Q6K) return unit_q6k(w, off1, off2, row, u, cols, xq, xds);
    if (FMT == FMT_Q80) return unit_q80(w, off1, row, u, cols, xq, xds);
    if (FMT == FMT_Q41) return unit_q41(w, row, u, cols, xq, xds);
    if (FMT == FMT_Q50) return unit_q50(w, off1, off2, row, u, cols, xq, xds);
    return unit_f16(w, row, u, cols, xf);
}

// One row dotted with one token's x; one warp, lanes take the units in turn.
// With a second level (xq2 != null, quantized formats only) each unit is dotted with both
// levels while its weights are in registers.
template <int FMT>
__device__ __forceinline__ float row_dot(const u8* w, u64 off1, u64 off2, u64 row, int cols,
                                         const i8* xq, const float2* xds, const float* xf,
                                         const i8* xq2, const float2* xds2) {
    int lane = threadIdx.x & 31;
    int units = units_per_row<FMT>(cols);
    float acc = 0.0f;
    if (FMT != FMT_F16 && xq2) {
#pragma unroll 2
        for (int u = lane; u < units; u += 32)
            acc += unit<FMT>(w, off1, off2, row, u, cols, xq, xds, xf) +
                   unit<FMT>(w, off1, off2, row, u, cols, xq2, xds2, xf);
    } else {
#pragma unroll 4
        for (int u = lane; u < units; u += 32)
            acc += unit<FMT>(w, off1, off2, row, u, cols, xq, xds, xf);
    }
    return warp_sum(acc);
}

// Up to three matrices of one format against the same x in one launch (Q/K/V, gate/up): blocks
// [0, nb0) take matrix 0, the next nb1 matrix 1, then matrix 2 (nb_i = ceil(rows_i / warps)),
// a warp per row. acc = 1 adds into out (the residual add of an output projection).
// Bytes of one weight row in plane `plane` (0..2) of format FMT (0: the plane is absent).
template <int FMT>
__device__ __forceinline__ u64 plane_row_bytes(int plane, int cols) {
    u64 b32 = (u64)(cols >> 5), b256 = (u64)(cols >> 8);
    if (FMT == FMT_Q4K) return plane == 0 ? b256 * 144 : 0;
    if (FMT == FMT_Q41) return plane == 0 ? b32 * 20 : 0;
    if (FMT == FMT_Q80) return plane == 0 ? b32 * 32 : plane == 1 ? b32 * 2 : 0;
    if (FMT == FMT_Q50) return plane == 0 ? b32 * 16 : plane == 1 ? b32 * 4 : b32 * 2;
    if (FMT == FMT_Q6K) return plane == 0 ? b256 * 192 : plane == 1 ? b256 * 16 : b256 * 2;
    return plane == 0 ? (u64)cols * 2 : 0;
}

// Asks L2 for weight rows [row0, row1) of w (every plane), the block's threads taking the
// 128-byte lines in turn. Weights are never written, so a GEMV issues this before PDL_WAIT():
// its weight stream starts while the kernel before it drains. Only a hint: no result depends
// on it.
template <int FMT>
__device__ __forceinline__ void prefetch_rows(const u8* w, u64 off1, u64 off2, int row0,
                                              int row1, int cols) {
    if (row1 <= row0) return;
    for (int plane = 0; plane < 3; plane++) {
        u64 rb = plane_row_bytes<FMT>(plane, cols);
        if (rb == 0) continue;
        const u8* base = w + (plane == 0 ? 0 : plane == 1 ? off1 : off2);
        u64 lo = (u64)(base + rb * row0), hi = (u64)(base + rb * row1);
        for (u64 a = (lo & ~(u64)127) + 128 * threadIdx.x; a < hi; a += 128 * (u64)blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
}

// A GEMV block's prologue: prefetch its weight rows when `pf`, then wait for the kernel
// before (PDL), then let the next one launch. Every thread runs it, before any early return.
template <int FMT>
__device__ __forceinline__ void gemv_prologue(const u8* w, u64 off1, u64 off2, int row0,
                                              int rows, int rpb, int cols, int pf) {
    if (pf) prefetch_rows<FMT>(w, off1, off2, row0, min(rows, row0 + rpb), cols);
    PDL_WAIT();
    PDL_TRIGGER();
}

// The activation fused into a gate/up GEMV (`gemv` with glu = 1 SwiGLU, 2 GeGLU; one token,
// slot 0 gate and slot 1 up, rows a multiple of 32, 32 / rpb blocks of each per 32-row chunk):
// a block that has written its rows counts itself in at its chunk's counter; the last of the
// chunk's 2 * 32 / rpb blocks computes gate = act(gate) * up for the chunk's 32 rows, in place,
// and their q8 block (into gq/gds unless null), as the `swiglu`/`geglu` kernels would, then
// resets the counter for the next pass. The same bits as the GEMV then the activation kernel.
__device__ __forceinline__ void glu_chunk(float* gate, const float* up, int row0, int rpb,
                                          int glu, i8* gq, float2* gds, u32* cnt) {
    __shared__ int last;
    int c = row0 >> 5;
    __threadfence();  // this block's writes, before the count says they are done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(cnt + c, 1u) == 2u * (32 / rpb) - 1;
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    int i = c * 32 + threadIdx.x;
    // volatile: the other blocks' rows, past L1.
    float g = ((volatile float*)gate)[i], u = ((volatile const float*)up)[i];
    float v = glu == 1 ? silu_mul(g, u) : gelu_mul(g, u);
    gate[i] = v;
    if (gq) q8_block(v, gq + c * 32, gds + c);
    if (threadIdx.x == 0) cnt[c] = 0;
}

template <int FMT>
__device__ __forceinline__ void gemv(const u8* w0, u64 a0, u64 b0, int rows0, float* out0,
                                     const u8* w1, u64 a1, u64 b1, int rows1, float* out1,
                                     const u8* w2, u64 a2, u64 b2, int rows2, float* out2,
                                     int cols, const i8* xq, const float2* xds, const float* xf,
                                     const i8* xq2, const float2* xds2, int acc, int pf,
                                     int glu, i8* gq, float2* gds, u32* cnt) {
    int rpb = blockDim.x >> 5;
    int nb0 = (rows0 + rpb - 1) / rpb, nb1 = (rows1 + rpb - 1) / rpb;
    int nb2 = (rows2 + rpb - 1) / rpb;
    // Grid x = (row block, token) with the token fastest: the blocks of one row block for
    // every token run side by side, so a batch of decode tokens reads each weight row from
    // DRAM once (L2 serves the other tokens). A token's sums are the one-token kernel's.
    int n_tok = gridDim.x / (nb0 + nb1 + nb2);
    int blk = blockIdx.x / n_tok;
    u64 t = blockIdx.x - (u64)blk * n_tok;
    const u8* w = w0;
    u64 off1 = a0, off2 = b0;
    int rows = rows0;
    float* out = out0;
    if (blk >= nb0 + nb1) {
        blk -= nb0 + nb1;
        w = w2, off1 = a2, off2 = b2, rows = rows2, out = out2;
    } else if (blk >= nb0) {
        blk -= nb0;
        w = w1, off1 = a1, off2 = b1, rows = rows1, out = out1;
    }
    gemv_prologue<FMT>(w, off1, off2, blk * rpb, rows, rpb, cols, pf && t == 0);
    int row = blk * rpb + (threadIdx.x >> 5);
    if (row < rows) {
        float v = row_dot<FMT>(w, off1, off2, row, cols, xq + t * cols, xds + t * (cols >> 5),
                               xf + t * cols, xq2 ? xq2 + t * cols : nullptr,
                               xq2 ? xds2 + t * (cols >> 5) : nullptr);
        if ((threadIdx.x & 31) == 0) {
            float* o = out + t * rows + row;
            *o = acc ? *o + v : v;
        }
    }
    if (glu) glu_chunk(out0, out1, blk * rpb, rpb, glu, gq, gds, cnt);
}

#define GEMV_PARAMS                                                                            \
    const u8 *w0, u64 a0, u64 b0, int rows0, float *out0, const u8 *w1, u64 a1, u64 b1,        \
        int rows1, float *out1, const u8 *w2, u64 a2, u64 b2, int rows2, float *out2,          \
        int cols, const i8 *xq, const float2 *xds, const float *xf, const i8 *xq2,             \
        const float2 *xds2, int acc, int pf
#define GEMV_ARGS                                                                              \
    w0, a0, b0, rows0, out0, w1, a1, b1, rows1, out1, w2, a2, b2, rows2, out2, cols, xq, xds,  \
        xf, xq2, xds2, acc, pf

#define INSTANTIATE(NAME, FMT)                                                                 \
    extern "C" __global__ void gemv_##NAME(GEMV_PARAMS, int glu, i8* gq, float2* gds,          \
                                           u32* cnt) {                                         \
        gemv<FMT>(GEMV_ARGS, glu, gq, gds, cnt);                                               \
    }                                                                                          \
    extern "C" __global__ void dequant_##NAME(const u8* w, u64 off1, u64 off2, int rows,       \
                                              int cols, const u32* ids, float* out_f32,        \
                                              u16* out_bf16) {                                 \
        PDL_START();                                                                           \
        dequant_rows<FMT>(w, off1, off2, rows, cols, ids, out_f32, out_bf16);                  \
    }

INSTANTIATE(q4k, FMT_Q4K)
INSTANTIATE(q41, FMT_Q41)
INSTANTIATE(q80, FMT_Q80)
INSTANTIATE(q50, FMT_Q50)
INSTANTIATE(q6k, FMT_Q6K)
INSTANTIATE(f16, FMT_F16)
