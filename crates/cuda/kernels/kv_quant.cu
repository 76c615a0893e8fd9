
// ---------------------------------------------------------------------------------------
// The cache write into a q8_0 KV cache (`rope_kv_q8`, and the paged pool's twin in paged.cu):
// RoPE as `rope_kv_pair` does it, each 32-value block of a key or value head row quantized as
// the CPU's `quantize_q8_0` does. Uses damascus.cu's helpers (`rope_kv_pair`, `kv_head_bytes`).

__device__ __forceinline__ float div_rn(float a, float b) {
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// x * inv rounded half away from zero, saturated to i8, NaN to 0 (Rust's `round() as i8`).
__device__ __forceinline__ int q8_round(float x) {
    float r = roundf(x);
    if (r != r) return 0;
    return (int)fminf(fmaxf(r, -128.0f), 127.0f);
}

// Element e of one head's row x [head_dim] after RoPE at `pos` (as `rope_kv_pair` rotates it):
// pairs (i, i + half) with neox, else (2i, 2i + 1), for pair indices i < half.
__device__ __forceinline__ float rope_elem(const float* x, int e, u32 pos, const float* inv_freq,
                                           int half, int neox) {
    int i, a, b;
    if (neox) {
        if (e >= 2 * half) return x[e];
        i = e < half ? e : e - half;
        a = i;
        b = i + half;
    } else {
        if (e >= 2 * half) return x[e];
        i = e >> 1;
        a = 2 * i;
        b = a + 1;
    }
    double theta = (double)pos * (double)inv_freq[i];
    double ds, dc;
    sincos(theta, &ds, &dc);
    float sn = (float)ds, cs = (float)dc;
    float x0 = x[a], x1 = x[b];
    return e == a ? x0 * cs - x1 * sn : x0 * sn + x1 * cs;
}

// Quantizes one 32-value block held two values (x0, x1) per lane by 16 aligned lanes of a
// warp as the CPU's `quantize_q8_0` does (d = amax / 127 rounded to f16, q = round(x / d) with
// the f32 inverse), writing the lane's two quants at qs and, from its first lane, the scale
// at d. Every lane of the warp must call it (`live` false: contributes nothing, stores
// nothing); the 16-lane groups do not mix.
__device__ __forceinline__ void q8_pair_store(float x0, float x1, bool live, i8* qs, u16* d,
                                              bool first) {
    float a = live ? fmaxf(fmaxf(0.0f, fabsf(x0)), fabsf(x1)) : 0.0f;
    _Pragma("unroll") for (int o = 8; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, o));
    if (!live) return;
    float scale = div_rn(a, 127.0f);
    float inv = scale != 0.0f ? div_rn(1.0f, scale) : 0.0f;
    u32 q0 = (u32)(q8_round(x0 * inv) & 0xFF), q1 = (u32)(q8_round(x1 * inv) & 0xFF);
    *(u16*)qs = (u16)(q0 | (q1 << 8));
    if (first) *d = f2h(scale);
}

// `rope_kv` into a q8_0 cache (same thread layout: one thread per element pair of a head).
// A KV head's thread i holds dims 2i, 2i + 1 of its rotated key and its value (each element
// rotated from the source row, `rope_elem`), so the 16 threads of a 32-block quantize it
// together (`q8_pair_store`); q heads rotate in place as in `rope_kv_pair`. Token t at
// position pos[t] (pos = inputs[0] + t when pos_arr is null) goes to cache slot slot[t] (the
// position itself when slot is null).
__device__ __forceinline__ void rope_kv_q8_at(float* q, const float* k, const float* v, u8* kc,
                                              u8* vc, const u32* inputs, const u32* pos_arr,
                                              const u32* slot_arr, const float* inv_freq,
                                              int n_tok, int n_head, int n_kv, int head_dim,
                                              int half, int neox, int n_ctx) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = head_dim >> 1;
    int per_tok = (n_head + n_kv) * pairs;
    bool live = idx < n_tok * per_tok;
    int t = 0, h = 0, i = 0;
    if (live) {
        t = idx / per_tok;
        int r = idx - t * per_tok;
        h = r / pairs;
        i = r - h * pairs;
    }
    u32 pos = pos_arr ? pos_arr[t] : inputs[0] + t;
    u32 slot = slot_arr ? slot_arr[t] : pos;
    if (live && h < n_head) {
        rope_kv_pair(q, k, v, nullptr, nullptr, inv_freq, t, h, i, pos, slot, n_head, n_kv,
                     head_dim, half, neox, n_ctx);
    }
    bool kvl = live && h >= n_head;
    int hk = kvl ? h - n_head : 0;
    const float* ks = k + ((u64)t * n_kv + hk) * head_dim;
    const float* vs = v + ((u64)t * n_kv + hk) * head_dim;
    float k0 = 0.0f, k1 = 0.0f, v0 = 0.0f, v1 = 0.0f;
    if (kvl) {
        k0 = rope_elem(ks, 2 * i, pos, inv_freq, half, neox);
        k1 = rope_elem(ks, 2 * i + 1, pos, inv_freq, half, neox);
        v0 = vs[2 * i];
        v1 = vs[2 * i + 1];
    }
    u64 hb = (u64)hk * kv_head_bytes<KV_Q8>(n_ctx, head_dim);
    u64 qo = (u64)slot * head_dim + 2 * i;
    u64 dof = (u64)n_ctx * head_dim + 2 * ((u64)slot * (head_dim / 32) + (2 * i) / 32);
    bool first = (i & 15) == 0;
    q8_pair_store(k0, k1, kvl, (i8*)(kc + hb + qo), (u16*)(kc + hb + dof), first);
    q8_pair_store(v0, v1, kvl, (i8*)(vc + hb + qo), (u16*)(vc + hb + dof), first);
}

extern "C" __global__ void rope_kv_q8(float* q, const float* k, const float* v, u8* kc, u8* vc,
                                      const u32* inputs, const float* inv_freq, int n_tok,
                                      int n_head, int n_kv, int head_dim, int half, int neox,
                                      int n_ctx) {
    PDL_START();
    rope_kv_q8_at(q, k, v, kc, vc, inputs, nullptr, nullptr, inv_freq, n_tok, n_head, n_kv,
                  head_dim, half, neox, n_ctx);
}
