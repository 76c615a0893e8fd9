
// ---------------------------------------------------------------------------------------
// Batched passes over the shared paged KV pool (the server's continuous batching): every row
// has its own position and cache slot, every sequence its own block table. The same device
// functions as a lone sequence's kernels (`rope_kv_pair`, `attn_split`, `attn_combine`,
// `attn_prefill`, `attn_flash`) with PAGED = true: only the address of a cached position
// changes (`kv_slot`), so a row gives the bits it gives alone (same split length, same order).
//
// `bat` is the pass's batch table (u32), uploaded once per pass:
//   pos  [n_tok]  position of each row
//   slot [n_tok]  its cache slot
//   tab  [n_tok]  where its sequence's block table starts in `bat`
//   list [n_dec]  the decode rows (sequences of one row this pass)
//   then the block tables.
// A decode split block (kv head, split, z) serves row list[z] with its own split length
// (`att_chunk`); partials [n_dec][n_head][n_split]. The prompt kernels run once per prompt
// chunk: q, out and `inputs` (its rows' positions) point at the chunk's first row, `table` at
// its sequence's block table.

// `rope_kv` for a batched pass over the paged cache: token t sits at position pos[t] and its
// keys and values go to cache slot slot[t] (from its sequence's block table). `_q8`: into a
// q8_0 pool.
extern "C" __global__ void rope_kv_paged(float* q, const float* k, const float* v, u16* kc,
                                         u16* vc, const u32* pos, const u32* slot,
                                         const float* inv_freq, int n_tok, int n_head,
                                         int n_kv, int head_dim, int half, int neox,
                                         int n_ctx) {
    PDL_START();
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = head_dim >> 1;
    int per_tok = (n_head + n_kv) * pairs;
    if (idx >= n_tok * per_tok) return;
    int t = idx / per_tok;
    int r = idx - t * per_tok;
    int h = r / pairs;
    int i = r - h * pairs;
    rope_kv_pair(q, k, v, kc, vc, inv_freq, t, h, i, pos[t], slot[t], n_head, n_kv, head_dim,
                 half, neox, n_ctx);
}
extern "C" __global__ void rope_kv_paged_q8(float* q, const float* k, const float* v, u8* kc,
                                            u8* vc, const u32* pos, const u32* slot,
                                            const float* inv_freq, int n_tok, int n_head,
                                            int n_kv, int head_dim, int half, int neox,
                                            int n_ctx) {
    PDL_START();
    rope_kv_q8_at(q, k, v, kc, vc, nullptr, pos, slot, inv_freq, n_tok, n_head, n_kv, head_dim,
                  half, neox, n_ctx);
}

// SUF/KV: the pool's element type (none/KV_F16, `_q8`/KV_Q8); the combine is
// element-independent (instantiated once, with the f16 kernels).
#define INSTANTIATE_ATTN_PAGED(D, BK, SUF, KV)                                                 \
    extern "C" __global__ void attn_split_paged_##D##SUF(                                      \
        const float* q, const u8* kc, const u8* vc, const u32* bat, float* part_o,             \
        float2* part_ml, int n_head, int group, int n_ctx, int n_split, float scale,           \
        int window, int bs, int n_tok) {                                                       \
        PDL_START();                                                                           \
        __shared__ float sm[MAX_GROUP * (D + ATT_CHUNK_MAX + 2 * ATT_THREADS)];                \
        int z = blockIdx.z;                                                                    \
        int row = bat[3 * n_tok + z];                                                          \
        const u32* inputs = bat + row;                                                         \
        const u32* table = bat + bat[2 * n_tok + row];                                         \
        int chunk = att_chunk(inputs[0] + 1);                                                  \
        q += (u64)row * n_head * D;                                                            \
        part_o += (u64)z * n_head * n_split * D;                                               \
        part_ml += (u64)z * n_head * n_split;                                                  \
        ATT_GROUPS(SPLIT_G, D, true, KV)                                                       \
    }                                                                                          \
    extern "C" __global__ void attn_prefill_paged_##D##SUF(                                    \
        const float* q, const u8* kc, const u8* vc, const u32* inputs, const u32* table,       \
        int bs, float* out, int n_tok, int n_head, int group, int n_ctx, float scale,          \
        int window) {                                                                          \
        __shared__ float sm[4 * MAX_GROUP * D];                                                \
        ATT_GROUPS(PREFILL_G, D, true, KV)                                                     \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) attn_flash_paged_##D##SUF(        \
        const float* q, const u8* kc, const u8* vc, const u32* inputs, const u32* table,       \
        int bs, float* out, int n_tok, int n_head, int group, int n_ctx, float scale,          \
        int window) {                                                                          \
        attn_flash<D, BK, true, KV>(q, kc, vc, inputs, out, n_tok, n_head, group, n_ctx,       \
                                    scale, window, table, bs);                                 \
    }
#define INSTANTIATE_COMBINE_PAGED(D)                                                           \
    extern "C" __global__ void attn_combine_paged_##D(                                         \
        const float* part_o, const float2* part_ml, const u32* bat, float* out, i8* q,         \
        float2* ds, int n_head, int n_split, int do_q, int window, int n_tok) {                \
        PDL_START();                                                                           \
        int z = blockIdx.y;                                                                    \
        int row = bat[3 * n_tok + z];                                                          \
        const u32* inputs = bat + row;                                                         \
        int chunk = att_chunk(inputs[0] + 1);                                                  \
        part_o += (u64)z * n_head * n_split * D;                                               \
        part_ml += (u64)z * n_head * n_split;                                                  \
        out += (u64)row * n_head * D;                                                          \
        if (do_q) {                                                                            \
            q += (u64)row * n_head * D;                                                        \
            ds += (u64)row * n_head * D / 32;                                                  \
        }                                                                                      \
        attn_combine<D>(part_o, part_ml, inputs, out, q, ds, n_split, chunk, do_q, window);    \
    }

INSTANTIATE_ATTN_PAGED(16, 64, , KV_F16)
INSTANTIATE_ATTN_PAGED(32, 64, , KV_F16)
INSTANTIATE_ATTN_PAGED(64, 64, , KV_F16)
INSTANTIATE_ATTN_PAGED(96, 64, , KV_F16)
INSTANTIATE_ATTN_PAGED(128, 64, , KV_F16)
INSTANTIATE_ATTN_PAGED(256, 32, , KV_F16)
INSTANTIATE_ATTN_PAGED(32, 64, _q8, KV_Q8)
INSTANTIATE_ATTN_PAGED(64, 64, _q8, KV_Q8)
INSTANTIATE_ATTN_PAGED(96, 64, _q8, KV_Q8)
INSTANTIATE_ATTN_PAGED(128, 64, _q8, KV_Q8)
INSTANTIATE_ATTN_PAGED(256, 32, _q8, KV_Q8)
INSTANTIATE_COMBINE_PAGED(16)
INSTANTIATE_COMBINE_PAGED(32)
INSTANTIATE_COMBINE_PAGED(64)
INSTANTIATE_COMBINE_PAGED(96)
INSTANTIATE_COMBINE_PAGED(128)
INSTANTIATE_COMBINE_PAGED(256)
