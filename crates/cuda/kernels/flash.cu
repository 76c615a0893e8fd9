
// ---------------------------------------------------------------------------------------
// Flash attention for prompts on tensor cores (mma.sync m16n8k16, f16 in, f32 accumulate),
// over the f16 head-major cache after `rope_kv` wrote this pass's keys and values.
//
// Block (kv head, row tile) of FA_WARPS warps. The rows of a tile are (token, query head of
// the group) pairs, flattened as R = t * group + g, so one K/V tile in shared memory serves
// every query head of the group (GQA). Warp w owns rows R0 + 16w .. +15. Row R (token t at
// position inputs[0] + t) sees positions att_lo(pos)..=pos: K/V tiles past the tile's last
// visible position are never loaded (causal tiles skipped), and a warp skips the tiles none of
// its rows see. Online softmax in base 2 (q pre-scaled by scale * log2 e), P kept in
// registers as the A operand of P·V (the S accumulator's layout is the A fragment's), V read
// with ldmatrix.trans. Dynamic shared memory: Q [FA_ROWS][D + 8], and two buffers of K and V
// [BK][D + 8] f16 (rows padded by 16 bytes: conflict-free fragment loads), the next tile
// streaming in with cp.async while this one is computed. The heaviest (last) row tiles run
// first. A q8_0 cache (KV_Q8) is widened to f16 on its way into shared memory (through
// registers, `kv_load`: q * d rounded once to f16), the rest unchanged.

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)
#define FA_THREADS (32 * FA_WARPS)

extern __shared__ uint4 fa_smem[];

__device__ __forceinline__ u32 pack_h2(float a, float b) {
    return (u32)f2h(a) | ((u32)f2h(b) << 16);
}

// c (16x8 f32) += a (16x16 f16, row) · b (16x8 f16, col).
__device__ __forceinline__ void mma_f16(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four transposed 8x8 f16 matrices from shared memory; lane l gives the address of row
// (l & 7) of matrix l >> 3.
__device__ __forceinline__ void ldsm_x4_t(u32* r, const u16* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// 16 bytes global -> shared without registers (zero-filled when !ok), then commit / wait.
__device__ __forceinline__ void cp_async16(u16* dst, const u16* src, bool ok) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// PAGED: keys and values of position p sit in slot kv_slot(p, table, bs) of the shared pool.
template <int D, int BK, bool PAGED, int KV>
__device__ __forceinline__ void attn_flash(const float* q, const u8* kc, const u8* vc,
                                           const u32* inputs, float* out, int n_tok,
                                           int n_head, int group, int n_ctx, float scale,
                                           int window, const u32* table, int bs) {
    const int S = D + 8;  // shared row stride, halfs
    const int NT = D / 8;  // output n-tiles
    const int ST = BK / 8;  // score n-tiles
    u16* sQ = (u16*)fa_smem;
    u16* sK = sQ + FA_ROWS * S;  // [2][K, V][BK][S]
    int kvh = blockIdx.x;
    int R0 = (gridDim.y - 1 - blockIdx.y) * FA_ROWS;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int gid = lane >> 2, tig = lane & 3;
    int pos0 = inputs[0];
    int n_rows = n_tok * group;

    const float qscale = scale * 1.4426950408889634f;
    for (int i = tid; i < FA_ROWS * (D / 4); i += FA_THREADS) {
        int r = i / (D / 4), c = (i % (D / 4)) * 4;
        int R = R0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (R < n_rows) {
            int t = R / group, g = R - t * group;
            v = *(const float4*)(q + ((u64)t * n_head + kvh * group + g) * D + c);
        }
        u32* dst = (u32*)(sQ + r * S + c);
        dst[0] = pack_h2(v.x * qscale, v.y * qscale);
        dst[1] = pack_h2(v.z * qscale, v.w * qscale);
    }

    // This thread's two rows (gid, gid + 8 of the warp's 16): the last position each sees
    // (-1: a padding row, sees nothing) and the first.
    int hi[2], lo[2];
    for (int r = 0; r < 2; r++) {
        int R = R0 + warp * 16 + gid + 8 * r;
        hi[r] = R < n_rows ? pos0 + R / group : -1;
        lo[r] = R < n_rows ? att_lo(hi[r], window) : 0;
    }
    int w_first = R0 + warp * 16;
    int w_last = min(w_first + 15, n_rows - 1);
    int w_hi = w_first < n_rows ? pos0 + w_last / group : -1;
    int w_lo = w_first < n_rows ? att_lo(pos0 + w_first / group, window) : 0;
    int b_last = min(R0 + FA_ROWS - 1, n_rows - 1);
    int p_hi = pos0 + b_last / group;
    int p_lo = att_lo(pos0 + R0 / group, window);

    const u8* kb = kc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    const u8* vb = vc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    float o[NT][4];
    _Pragma("unroll") for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // K/V tiles double-buffered: tile i + 1 streams in (cp.async) while tile i is computed.
    auto load = [&](int kt0, int buf) {
        u16* dk = sK + buf * 2 * BK * S;
        u16* dv = dk + BK * S;
        for (int i = tid; i < BK * (D / 8); i += FA_THREADS) {
            int r = i / (D / 8), c = (i % (D / 8)) * 8;
            int p = kt0 + r;
            bool ok = p <= p_hi;
            u32 slot = ok ? kv_slot<PAGED>(p, table, bs) : 0;
            if (KV == KV_F16) {
                u64 off = (u64)slot * D + c;
                cp_async16(dk + r * S + c, (const u16*)kb + off, ok);
                cp_async16(dv + r * S + c, (const u16*)vb + off, ok);
            } else {
                float f[8];
                uint4 w = make_uint4(0, 0, 0, 0);
                if (ok) {
                    kv_load<KV, D, 8>(kb, n_ctx, slot, c, f);
                    w = make_uint4(pack_h2(f[0], f[1]), pack_h2(f[2], f[3]), pack_h2(f[4], f[5]),
                                   pack_h2(f[6], f[7]));
                }
                *(uint4*)(dk + r * S + c) = w;
                if (ok) {
                    kv_load<KV, D, 8>(vb, n_ctx, slot, c, f);
                    w = make_uint4(pack_h2(f[0], f[1]), pack_h2(f[2], f[3]), pack_h2(f[4], f[5]),
                                   pack_h2(f[6], f[7]));
                }
                *(uint4*)(dv + r * S + c) = w;
            }
        }
        cp_async_commit();
    };
    int kt_first = p_lo - p_lo % BK;
    load(kt_first, 0);
    for (int kt0 = kt_first, it = 0; kt0 <= p_hi; kt0 += BK, it++) {
        if (kt0 + BK <= p_hi) {
            load(kt0 + BK, (it + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile `it` (and Q) visible to every warp
        const u16* tK = sK + (it & 1) * 2 * BK * S;
        const u16* tV = tK + BK * S;
        if (kt0 > w_hi || kt0 + BK <= w_lo) {
            __syncthreads();  // the buffer is refilled next iteration
            continue;
        }

        float s[ST][4];
        _Pragma("unroll") for (int n = 0; n < ST; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        _Pragma("unroll") for (int kk = 0; kk < D; kk += 16) {
            const u16* qa = sQ + (warp * 16 + gid) * S + kk + tig * 2;
            u32 a[4] = {*(const u32*)qa, *(const u32*)(qa + 8 * S), *(const u32*)(qa + 8),
                        *(const u32*)(qa + 8 * S + 8)};
            _Pragma("unroll") for (int n = 0; n < ST; n++) {
                const u16* kp = tK + (n * 8 + gid) * S + kk + tig * 2;
                u32 b[2] = {*(const u32*)kp, *(const u32*)(kp + 8)};
                mma_f16(s[n], a, b);
            }
        }

        float mx[2] = {m[0], m[1]};
        _Pragma("unroll") for (int n = 0; n < ST; n++)
            _Pragma("unroll") for (int e = 0; e < 4; e++) {
                int r = e >> 1;
                int p = kt0 + n * 8 + tig * 2 + (e & 1);
                float v = (p <= hi[r] && p >= lo[r]) ? s[n][e] : -INFINITY;
                s[n][e] = v;
                mx[r] = fmaxf(mx[r], v);
            }
        float corr[2];
        _Pragma("unroll") for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL, mx[r], 2));
            float base = mx[r] == -INFINITY ? 0.0f : mx[r];
            corr[r] = exp2f(m[r] - base);
            m[r] = mx[r];
            mx[r] = base;
        }
        float ls[2] = {0.0f, 0.0f};
        _Pragma("unroll") for (int n = 0; n < ST; n++)
            _Pragma("unroll") for (int e = 0; e < 4; e++) {
                float p = exp2f(s[n][e] - mx[e >> 1]);
                s[n][e] = p;
                ls[e >> 1] += p;
            }
        _Pragma("unroll") for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + ls[r];
        _Pragma("unroll") for (int n = 0; n < NT; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }

        _Pragma("unroll") for (int kk = 0; kk < BK / 16; kk++) {
            u32 a[4] = {pack_h2(s[2 * kk][0], s[2 * kk][1]), pack_h2(s[2 * kk][2], s[2 * kk][3]),
                        pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                        pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const u16* vrow = tV + (kk * 16 + (lane & 15)) * S + (lane >> 4) * 8;
            _Pragma("unroll") for (int n = 0; n < NT; n += 2) {
                u32 b[4];
                ldsm_x4_t(b, vrow + n * 8);
                mma_f16(o[n], a, b);
                mma_f16(o[n + 1], a, b + 2);
            }
        }
        __syncthreads();  // the buffer is refilled next iteration
    }

    _Pragma("unroll") for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL, l[r], 1);
        l[r] += __shfl_xor_sync(FULL, l[r], 2);
        int R = R0 + warp * 16 + gid + 8 * r;
        if (R >= n_rows) continue;
        int t = R / group, g = R - t * group;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        float* dst = out + ((u64)t * n_head + kvh * group + g) * D + tig * 2;
        _Pragma("unroll") for (int n = 0; n < NT; n++)
            *(float2*)(dst + n * 8) = make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
}

#define INSTANTIATE_FLASH(D, BK, SUF, KV)                                                      \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                   \
        attn_flash_##D##SUF(const float* q, const u8* kc, const u8* vc, const u32* inputs,     \
                            float* out, int n_tok, int n_head, int group, int n_ctx,           \
                            float scale, int window) {                                         \
        attn_flash<D, BK, false, KV>(q, kc, vc, inputs, out, n_tok, n_head, group, n_ctx,      \
                                     scale, window, nullptr, 1);                               \
    }

INSTANTIATE_FLASH(16, 64, , KV_F16)
INSTANTIATE_FLASH(32, 64, , KV_F16)
INSTANTIATE_FLASH(64, 64, , KV_F16)
INSTANTIATE_FLASH(96, 64, , KV_F16)
INSTANTIATE_FLASH(128, 64, , KV_F16)
INSTANTIATE_FLASH(256, 32, , KV_F16)
INSTANTIATE_FLASH(32, 64, _q8, KV_Q8)
INSTANTIATE_FLASH(64, 64, _q8, KV_Q8)
INSTANTIATE_FLASH(96, 64, _q8, KV_Q8)
INSTANTIATE_FLASH(128, 64, _q8, KV_Q8)
INSTANTIATE_FLASH(256, 32, _q8, KV_Q8)
