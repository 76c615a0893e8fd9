
// ---------------------------------------------------------------------------------------
// Decode attention, streamed (`attn_decode_*`, `KernelSettings::cuda_attn_v2`): the split-K
// decode of one query token per sequence over the f16 cache, built to read K and V at HBM
// bandwidth. The twin and fallback is `attn_split` (damascus.cu); both write the same
// partials (part_o [n_head][n_split][D] unnormalized, part_ml [n_head][n_split] (m, l)) for
// the same splits (`chunk` positions each, `decode_chunk` / `att_chunk`), so `attn_combine`
// merges either.
//
// Block (kv head, split [, decode row]) of AD_THREADS threads covers the split's visible
// positions [lo, hi) for the whole GQA group (each K/V row is read once for the G query heads)
// in tiles of AD_TILE positions. K and V tiles stream into shared memory with 16-byte
// `cp.async` copies through a ring of AD_STAGES(D) stages: tiles t + 1 .. t + AD_STAGES - 1
// are in flight while tile t is scored and accumulated (16 to 32 KiB per block). Per tile:
//   scores  — D / 8 threads per position, 16 bytes (8 dims) of its key row each, q of those
//             dims for all G heads held in registers, summed across the threads by shuffles;
//   softmax — a warp per query head (lane = position): the running max m and sum l of the
//             block (online softmax), the tile's weights e = exp(s - m) in place of the scores;
//   values  — a thread per (8 dims, position group): o[g] = o[g] * corr[g] + sum e[g][p] v[p].
// At the end the position groups' o are summed through shared memory in a fixed order. No
// atomics: a graph replay gives the eager launch's bits, and a row of a paged batch the bits
// it gets alone (same chunk, same tiles, same order).
//
// Positions outside [lo, hi) are never loaded (cp.async zero-fills their rows), so a sliding
// window costs only the rows it sees. Paged: every row's slot comes from the block table
// (`kv_slot`), so any block size works.

#define AD_THREADS 128  // 4 warps: the softmax step gives each warp query heads w and w + 4
#define AD_TILE 32      // positions per K/V tile (one per lane in the softmax step)
#define AD_WARPS (AD_THREADS / 32)

// Stages of the K/V tile ring for head size D: 4 x 8 KiB, 3 x 16 KiB or 2 x 32 KiB of K and V.
#define AD_STAGES(D) ((D) <= 64 ? 4 : ((D) <= 128 ? 3 : 2))
// Bytes of the tile region for head size D: the ring [AD_STAGES][2][AD_TILE][D] f16, reused
// after the loop for the position groups' partial o [NPG][G][D] f32 (NPG * D = AD_THREADS * 8
// floats per head, so G * 4 KiB).
#define AD_RING(D) (AD_STAGES(D) * 2 * AD_TILE * (D) * 2)
#define AD_REGION(D) (AD_RING(D) > (MAX_GROUP * AD_THREADS * 8 * 4) \
                          ? AD_RING(D)                              \
                          : (MAX_GROUP * AD_THREADS * 8 * 4))

extern __shared__ uint4 ad_smem[];

// The f32 values of 8 consecutive cached elements of one K or V row at `e` (16 bytes of f16,
// in shared memory). The one place a cached element is widened: another cache element type
// (q8_0) adds its case here and in the tile copy.
__device__ __forceinline__ void kv_load8(const u16* e, float f[8]) {
    uint4 w = *(const uint4*)e;
    u32 ws[4] = {w.x, w.y, w.z, w.w};
    _Pragma("unroll") for (int j = 0; j < 4; j++) {
        f[2 * j] = h2f((u16)(ws[j] & 0xFFFF));
        f[2 * j + 1] = h2f((u16)(ws[j] >> 16));
    }
}

// One decode split of `chunk` positions (see above). q [n_head][D] f32 (the query token),
// kc/vc [n_kv][n_ctx][D] f16 (this layer), inputs[0] the query's position.
template <int D, int G, bool PAGED>
__device__ void attn_decode(const float* q, const u16* kc, const u16* vc, const u32* inputs,
                            float* part_o, float2* part_ml, int n_ctx, int n_split, int chunk,
                            float scale, int window, const u32* table, int bs) {
    constexpr int CPR = D / 8;                 // 16-byte chunks per cached row
    constexpr int PPP = AD_THREADS / CPR;      // positions per score pass = value groups
    constexpr int TILE = AD_TILE * D;          // f16 elements of one K or V tile
    constexpr int NST = AD_STAGES(D);
    static_assert(AD_THREADS % CPR == 0 && AD_TILE % PPP == 0, "head size");
    static_assert(G <= 2 * AD_WARPS, "group");
    int kvh = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
    int n_pos = inputs[0] + 1;
    int lo = max(att_lo(n_pos - 1, window), split * chunk);
    int hi = min(n_pos, split * chunk + chunk);
    if (lo >= hi) return;  // a split past the query or before its window: not combined
    u16* tiles = (u16*)ad_smem;                                     // [NST][2][AD_TILE][D]
    float* red = (float*)ad_smem;                                     // [PPP][G][D], after
    float(*sc)[AD_TILE] = (float(*)[AD_TILE])((char*)ad_smem + AD_REGION(D));  // [G][TILE]
    float* cr = (float*)((char*)ad_smem + AD_REGION(D)) + MAX_GROUP * AD_TILE;  // [G]
    const u16* kb = kc + (u64)kvh * n_ctx * D;
    const u16* vb = vc + (u64)kvh * n_ctx * D;
    int part = tid % CPR, pl = tid / CPR;  // this thread's 8 dims and position lane
    int warp = tid >> 5, lane = tid & 31;

    float qr[G][8];  // q of this thread's dims, scaled
    _Pragma("unroll") for (int g = 0; g < G; g++) {
        const float* qg = q + (u64)(kvh * G + g) * D + part * 8;
        float4 a = *(const float4*)qg, b = *(const float4*)(qg + 4);
        qr[g][0] = a.x * scale;
        qr[g][1] = a.y * scale;
        qr[g][2] = a.z * scale;
        qr[g][3] = a.w * scale;
        qr[g][4] = b.x * scale;
        qr[g][5] = b.y * scale;
        qr[g][6] = b.z * scale;
        qr[g][7] = b.w * scale;
    }

    int n_tiles = (hi - lo + AD_TILE - 1) / AD_TILE;
    // Tile t (positions lo + t * AD_TILE ..) into stage `buf`; rows at or past hi zero-filled.
    // One commit group per call, an empty one past the last tile (so that "tile t landed" is
    // always "all but the newest NST - 2 groups done").
    auto load = [&](int t, int buf) {
        if (t >= n_tiles) {
            cp_async_commit();
            return;
        }
        int base = lo + t * AD_TILE;
        u16* dk = tiles + buf * 2 * TILE;
        u16* dv = dk + TILE;
        _Pragma("unroll") for (int i = tid; i < AD_TILE * CPR; i += AD_THREADS) {
            int r = i / CPR, c = i % CPR;
            int p = base + r;
            bool ok = p < hi;
            u64 off = ok ? (u64)kv_slot<PAGED>(p, table, bs) * D + c * 8 : 0;
            cp_async16(dk + r * D + c * 8, kb + off, ok);
            cp_async16(dv + r * D + c * 8, vb + off, ok);
        }
        cp_async_commit();
    };

    float m_run[2], l_run[2];  // the running max and sum of heads warp and warp + AD_WARPS
    _Pragma("unroll") for (int i = 0; i < 2; i++) {
        m_run[i] = -INFINITY;
        l_run[i] = 0.0f;
    }
    float o[G][8];
    _Pragma("unroll") for (int g = 0; g < G; g++)
        _Pragma("unroll") for (int j = 0; j < 8; j++) o[g][j] = 0.0f;

    _Pragma("unroll") for (int t = 0; t < NST - 1; t++) load(t, t);
    for (int t = 0; t < n_tiles; t++) {
        cp_async_wait<NST - 2>();
        // Tile t is visible to every thread, and every thread is done with tile t - 1 (its
        // stage, the weights and corrections): tile t + NST - 1 may stream into that stage.
        __syncthreads();
        load(t + NST - 1, (t + NST - 1) % NST);
        const u16* tk = tiles + (t % NST) * 2 * TILE;
        const u16* tv = tk + TILE;
        int n_here = min(AD_TILE, hi - lo - t * AD_TILE);  // >= 1

        // Scores: row r of the tile by the CPR threads of position lane pl.
        _Pragma("unroll") for (int r0 = 0; r0 < AD_TILE; r0 += PPP) {
            int r = r0 + pl;
            float kf[8];
            kv_load8(tk + r * D + part * 8, kf);
            float s[G];
            _Pragma("unroll") for (int g = 0; g < G; g++) {
                float a = 0.0f;
                _Pragma("unroll") for (int j = 0; j < 8; j++) a += qr[g][j] * kf[j];
                s[g] = a;
            }
            _Pragma("unroll") for (int off = CPR / 2; off > 0; off >>= 1)
                _Pragma("unroll") for (int g = 0; g < G; g++)
                    s[g] += __shfl_xor_sync(FULL, s[g], off);
            if (part == 0)
                _Pragma("unroll") for (int g = 0; g < G; g++)
                    sc[g][r] = r < n_here ? s[g] : -INFINITY;
        }
        __syncthreads();

        // Online softmax: warp w updates heads w and w + AD_WARPS (row 0 is always visible,
        // so the tile's max is finite).
        _Pragma("unroll") for (int i = 0; i < 2; i++) {
            int g = warp + i * AD_WARPS;
            if (g < G) {
                float s = sc[g][lane];
                float mn = fmaxf(m_run[i], warp_max(s));
                float c = expf(m_run[i] - mn);
                float e = expf(s - mn);
                l_run[i] = l_run[i] * c + warp_sum(e);
                m_run[i] = mn;
                sc[g][lane] = e;
                if (lane == 0) cr[g] = c;
            }
        }
        __syncthreads();

        // Values: this thread's 8 dims over rows pl, pl + PPP, ...
        _Pragma("unroll") for (int g = 0; g < G; g++) {
            float c = cr[g];
            _Pragma("unroll") for (int j = 0; j < 8; j++) o[g][j] *= c;
        }
        _Pragma("unroll") for (int r = pl; r < AD_TILE; r += PPP) {
            if (r < n_here) {
                float vf[8];
                kv_load8(tv + r * D + part * 8, vf);
                _Pragma("unroll") for (int g = 0; g < G; g++) {
                    float e = sc[g][r];
                    _Pragma("unroll") for (int j = 0; j < 8; j++) o[g][j] += e * vf[j];
                }
            }
        }
    }
    // Every copy has landed (the groups after the last tile are empty) and every thread is
    // past its last tile read: the tile region takes the position groups' partial o.
    cp_async_wait<0>();
    __syncthreads();
    _Pragma("unroll") for (int g = 0; g < G; g++) {
        float4* rg = (float4*)(red + (pl * G + g) * D + part * 8);
        rg[0] = make_float4(o[g][0], o[g][1], o[g][2], o[g][3]);
        rg[1] = make_float4(o[g][4], o[g][5], o[g][6], o[g][7]);
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += AD_THREADS) {
        int g = i / D, d = i % D;
        float r = 0.0f;
        _Pragma("unroll") for (int j = 0; j < PPP; j++) r += red[(j * G + g) * D + d];
        part_o[((u64)(kvh * G + g) * n_split + split) * D + d] = r;
    }
    _Pragma("unroll") for (int i = 0; i < 2; i++) {
        int g = warp + i * AD_WARPS;
        if (g < G && lane == 0)
            part_ml[(kvh * G + g) * n_split + split] = make_float2(m_run[i], l_run[i]);
    }
}

// `group` (1..=MAX_GROUP, checked on the host) picks the instantiation. Dynamic shared memory:
// AD_REGION(D) + (MAX_GROUP * AD_TILE + MAX_GROUP) floats (the host's `attn_decode_smem`).
// The private kernel has attn_split's arguments; the paged one attn_split_paged's (a decode
// row per blockIdx.z, its split length from its own depth).
#define AD_ARGS q, kc, vc, inputs, part_o, part_ml, n_ctx, n_split, chunk, scale, window, table, bs
#define AD_GROUPS(D, PAGED)                                                                    \
    switch (group) {                                                                           \
        case 1: attn_decode<D, 1, PAGED>(AD_ARGS); break;                                      \
        case 2: attn_decode<D, 2, PAGED>(AD_ARGS); break;                                      \
        case 3: attn_decode<D, 3, PAGED>(AD_ARGS); break;                                      \
        case 4: attn_decode<D, 4, PAGED>(AD_ARGS); break;                                      \
        case 5: attn_decode<D, 5, PAGED>(AD_ARGS); break;                                      \
        case 6: attn_decode<D, 6, PAGED>(AD_ARGS); break;                                      \
        case 7: attn_decode<D, 7, PAGED>(AD_ARGS); break;                                      \
        default: attn_decode<D, 8, PAGED>(AD_ARGS); break;                                     \
    }

#define INSTANTIATE_ATTN_DECODE(D)                                                             \
    extern "C" __global__ void __launch_bounds__(AD_THREADS) attn_decode_##D(                  \
        const float* q, const u16* kc, const u16* vc, const u32* inputs, float* part_o,        \
        float2* part_ml, int n_head, int group, int n_ctx, int n_split, int chunk,             \
        float scale, int window) {                                                             \
        PDL_START();                                                                           \
        const u32* table = nullptr;                                                            \
        int bs = 1;                                                                            \
        AD_GROUPS(D, false)                                                                    \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(AD_THREADS) attn_decode_paged_##D(            \
        const float* q, const u16* kc, const u16* vc, const u32* bat, float* part_o,           \
        float2* part_ml, int n_head, int group, int n_ctx, int n_split, float scale,           \
        int window, int bs, int n_tok) {                                                       \
        PDL_START();                                                                           \
        int z = blockIdx.z;                                                                    \
        int row = bat[3 * n_tok + z];                                                          \
        const u32* inputs = bat + row;                                                         \
        const u32* table = bat + bat[2 * n_tok + row];                                         \
        int chunk = att_chunk(inputs[0] + 1);                                                  \
        q += (u64)row * n_head * D;                                                            \
        part_o += (u64)z * n_head * n_split * D;                                               \
        part_ml += (u64)z * n_head * n_split;                                                  \
        AD_GROUPS(D, true)                                                                     \
    }

INSTANTIATE_ATTN_DECODE(64)
INSTANTIATE_ATTN_DECODE(128)
INSTANTIATE_ATTN_DECODE(256)
