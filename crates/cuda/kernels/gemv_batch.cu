
// ---------------------------------------------------------------------------------------
// GEMV for a decode batch (2 to GEMM_MIN_TOKENS - 1 tokens): a warp takes one weight row for up
// to GB_TOK tokens, so each weight unit is loaded (and unpacked) once for all of them instead
// of once per token. Token t's sum runs over the same units in the same order as the one-token
// `gemv` (a lane's units in turn, then the warp sum), with the second q8 level where given:
// a token's result is the bits of its own pass (tested). Grid x = (row block, token group)
// with the group fastest; matrix slots as in `gemv`.

#define GB_TOK 8

template <int FMT>
__device__ __forceinline__ void gemv_batch(const u8* w0, u64 a0, u64 b0, int rows0,
                                           float* out0, const u8* w1, u64 a1, u64 b1, int rows1,
                                           float* out1, const u8* w2, u64 a2, u64 b2, int rows2,
                                           float* out2, int cols, const i8* xq,
                                           const float2* xds, const float* xf, const i8* xq2,
                                           const float2* xds2, int acc, int pf, int n_tok) {
    int rpb = blockDim.x >> 5;
    int nb0 = (rows0 + rpb - 1) / rpb, nb1 = (rows1 + rpb - 1) / rpb;
    int n_grp = (n_tok + GB_TOK - 1) / GB_TOK;
    int blk = blockIdx.x / n_grp;
    int grp = blockIdx.x - blk * n_grp;
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
    gemv_prologue<FMT>(w, off1, off2, blk * rpb, rows, rpb, cols, pf && grp == 0);
    int row = blk * rpb + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31;
    u64 t0 = (u64)grp * GB_TOK;
    int nt = min(GB_TOK, n_tok - (int)t0);
    bool two = FMT != FMT_F16 && xq2;
    int units = units_per_row<FMT>(cols);
    float s[GB_TOK];
    _Pragma("unroll") for (int j = 0; j < GB_TOK; j++) s[j] = 0.0f;
    // The one-token kernel's two loops, expression for expression (so each token's sums
    // round, and contract into FMAs, the same way). Token 0 of the group runs unconditionally,
    // so its weight loads dominate (and serve) the other tokens'.
    if (two) {
        for (int u = lane; u < units; u += 32)
            _Pragma("unroll") for (int j = 0; j < GB_TOK; j++) if (j == 0 || j < nt) {
                u64 t = t0 + j;
                s[j] += unit<FMT>(w, off1, off2, row, u, cols, xq + t * cols,
                                  xds + t * (cols >> 5), xf + t * cols) +
                        unit<FMT>(w, off1, off2, row, u, cols, xq2 + t * cols,
                                  xds2 + t * (cols >> 5), xf + t * cols);
            }
    } else {
        for (int u = lane; u < units; u += 32)
            _Pragma("unroll") for (int j = 0; j < GB_TOK; j++) if (j == 0 || j < nt) {
                u64 t = t0 + j;
                s[j] += unit<FMT>(w, off1, off2, row, u, cols, xq + t * cols,
                                  xds + t * (cols >> 5), xf + t * cols);
            }
    }
    _Pragma("unroll") for (int j = 0; j < GB_TOK; j++) {
        if (j == 0 || j < nt) {
            float v = warp_sum(s[j]);
            if (lane == 0) {
                float* o = out + (t0 + j) * rows + row;
                *o = acc ? *o + v : v;
            }
        }
    }
}

#define INSTANTIATE_GEMV_BATCH(NAME, FMT)                                                      \
    extern "C" __global__ void gemv_batch_##NAME(GEMV_PARAMS, int n_tok) {                     \
        gemv_batch<FMT>(GEMV_ARGS, n_tok);                                                     \
    }

INSTANTIATE_GEMV_BATCH(q4k, FMT_Q4K)
INSTANTIATE_GEMV_BATCH(q41, FMT_Q41)
INSTANTIATE_GEMV_BATCH(q80, FMT_Q80)
INSTANTIATE_GEMV_BATCH(q50, FMT_Q50)
INSTANTIATE_GEMV_BATCH(q6k, FMT_Q6K)
INSTANTIATE_GEMV_BATCH(f16, FMT_F16)
