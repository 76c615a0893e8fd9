// Damascus CUDA kernels. Compiled at run time with NVRTC (no CUDA headers needed: every type
// and conversion below is spelled out), cached on disk by hash of this text and the target.
//
// Conventions
// * Activations are f32 row-major [n_tokens, width]. Their q8 shadow (for the dp4a GEMVs) is
//   xq int8 [n_tokens, width] plus xds float2 [n_tokens, width / 32] = (d, d * sum(q)) per
//   32-block: x ~= d * q.
// * Weight matrices [rows, cols] live in one device buffer per tensor, in a per-format layout
//   (FMT_*). Formats whose GGUF blocks are not 4-byte aligned (Q8_0 34 B, Q5_0 22 B, Q6_K 210 B)
//   are split on the host into aligned planes: plane 0 at byte 0, plane 1 at off1, plane 2 at
//   off2, each indexed by block = row * blocks_per_row + b.
//     FMT_Q4K  native 144-byte blocks (d, dmin, scales[12], qs[128])
//     FMT_Q41  native 20-byte blocks  (d, m, qs[16])
//     FMT_Q80  plane0 qs[32]          plane1 d (f16)
//     FMT_Q50  plane0 qs[16]          plane1 qh (u32)      plane2 d (f16)
//     FMT_Q6K  plane0 ql[128] qh[64]  plane1 scales[16] i8 plane2 d (f16)
//     FMT_F16  plane0 [rows, cols] f16 (every other type, dequantized on the host)
// * The KV cache is head-major, [layer][n_head_kv] regions of n_ctx rows of head_dim values,
//   f16 (KV_F16) or q8_0 (KV_Q8: the head's i8 quants [n_ctx][head_dim], then its f16 scales
//   [n_ctx][head_dim / 32], the region padded to 16 bytes); see `kv_head_bytes`.
// * `inputs` is a small device buffer the host writes before each forward pass:
//   inputs[0] = pos0 (position of token 0), inputs[1 + t] = token id of token t. Kernels read
//   positions from it, so a captured decode graph replays unchanged at every position.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FMT_Q4K 0
#define FMT_Q41 1
#define FMT_Q80 2
#define FMT_Q50 3
#define FMT_Q6K 4
#define FMT_F16 5

#define FULL 0xffffffffu
#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (sm_90+). A kernel the host launches with the programmatic
// stream-serialization attribute (`DAMASCUS_CUDA_PDL=1`) may start while the kernel before it
// drains; `PDL_WAIT()` then blocks until that kernel has completed and its writes are
// visible, so every such kernel runs it before touching anything another kernel writes (and
// before its own writes). Every thread of it runs `PDL_WAIT()` before its first early return
// too, so the grid never completes before the one it waited for: the chain stays transitive.
// `PDL_TRIGGER()` lets the next kernel's blocks launch early. Without the attribute (or below
// sm_90) both are no-ops, so results are the same bits either way. The host launches a
// kernel with the attribute only where its PTX holds `griddepcontrol.wait`.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() \
    do {           \
    } while (0)
#define PDL_TRIGGER() \
    do {              \
    } while (0)
#endif
// The prologue of a small kernel: the next kernel may launch at once (it waits in turn), then
// this one waits for its inputs. One line at the top of a kernel.
#define PDL_START()    \
    do {               \
        PDL_TRIGGER(); \
        PDL_WAIT();    \
    } while (0)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ u16 f2bf(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
__device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
__device__ __forceinline__ u32 ld32(const u8* p) { return *(const u32*)p; }
__device__ __forceinline__ uint4 ld128(const u8* p) { return *(const uint4*)p; }

// What `d * q` misses of x: the input of a two-level shadow's second level. One spelling (an
// explicit fma) for `quantize_q8_res` and the fused `rms_norm`, so both give the same bits.
__device__ __forceinline__ float q8_res(float x, float d, i8 q) {
    return __fmaf_rn(-d, (float)q, x);
}

// Quantizes one 32-block held one element per lane of a full warp; returns what the q8 value
// misses of v (the second level's input: `q8_res`).
__device__ __forceinline__ float q8_block(float v, i8* q, float2* ds) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    int qi = __float2int_rn(v * id);
    q[lane] = (i8)qi;
    int s = warp_sum_i(qi);
    if (lane == 0) *ds = make_float2(d, d * (float)s);
    return q8_res(v, d, (i8)qi);
}

// ---------------------------------------------------------------------------------------
// Elementwise and normalization.

// x [n_blocks * 32] f32 -> q8. One warp per 32-block.
extern "C" __global__ void quantize_q8(const float* x, i8* q, float2* ds, int n_blocks) {
    PDL_START();
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    int lane = threadIdx.x & 31;
    q8_block(x[b * 32 + lane], q + b * 32, ds + b);
}

// The two-level shadow's second level: what q/ds miss of x, quantized again (q2, ds2), so
// that x ≈ d₁q₁ + d₂q₂ (the Q/K/V projections' inputs). One warp per 32-block.
extern "C" __global__ void quantize_q8_res(const float* x, const i8* q, const float2* ds,
                                           i8* q2, float2* ds2, int n_blocks) {
    PDL_START();
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    int lane = threadIdx.x & 31;
    float r = q8_res(x[b * 32 + lane], ds[b].x, q[b * 32 + lane]);
    q8_block(r, q2 + b * 32, ds2 + b);
}

// out = x * rsqrt(mean(x^2) + eps) * w; also the q8 shadow of out when do_q (width % 32 ==
// 0), and its second level (`quantize_q8_res`, the same bits) into q2/ds2 when q2 is given.
// Grid (blocks per token, n_tok): every block sums the squares of its token's whole row
// (L2-resident, strided by blockDim.x), then its warps scale the 32-element chunks it owns
// (chunk b goes to block (b / warps) % blocks). Decode spreads one token over several blocks;
// a prompt gives each token one block (no row read more than twice).
extern "C" __global__ void rms_norm(const float* x, const float* w, float eps, float* out,
                                    i8* q, float2* ds, i8* q2, float2* ds2, int width,
                                    int do_q) {
    PDL_START();
    __shared__ float red[32];
    int t = blockIdx.y;
    const float* xr = x + (u64)t * width;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float v = lane < nw ? red[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    float scale = 1.0f / sqrtf(red[0] / (float)width + eps);
    for (int b = blockIdx.x * nw + warp; b * 32 < width; b += gridDim.x * nw) {
        int i = b * 32 + lane;
        float v = i < width ? xr[i] * scale * w[i] : 0.0f;
        if (i < width) out[(u64)t * width + i] = v;
        if (do_q) {
            float r = q8_block(v, q + (u64)t * width + b * 32, ds + (u64)t * (width >> 5) + b);
            if (q2) q8_block(r, q2 + (u64)t * width + b * 32, ds2 + (u64)t * (width >> 5) + b);
        }
    }
}

// silu(g) * u and gelu_tanh(g) * u: one spelling for the activation kernels and the GEMV that
// fuses them (`gemv` with glu), so both give the same bits.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float gelu_mul(float g, float u) {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
}

// gate = silu(gate) * up over n elements; also the q8 shadow of gate (n % 32 == 0). One warp
// per 32-block.
extern "C" __global__ void swiglu(float* gate, const float* up, i8* q, float2* ds, int n_blocks,
                                  int do_q) {
    PDL_START();
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    int i = b * 32 + (threadIdx.x & 31);
    float v = silu_mul(gate[i], up[i]);
    gate[i] = v;
    if (do_q) q8_block(v, q + b * 32, ds + b);
}

// gate = gelu_tanh(gate) * up over n elements (GeGLU); also the q8 shadow of gate (n % 32 ==
// 0). One warp per 32-block.
extern "C" __global__ void geglu(float* gate, const float* up, i8* q, float2* ds, int n_blocks,
                                 int do_q) {
    PDL_START();
    int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= n_blocks) return;
    int i = b * 32 + (threadIdx.x & 31);
    float v = gelu_mul(gate[i], up[i]);
    gate[i] = v;
    if (do_q) q8_block(v, q + b * 32, ds + b);
}

// x[t, i] += b[i]: x [n / width, width].
extern "C" __global__ void add_bias(float* x, const float* b, int width, int n) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % width];
}

// RMSNorm of every row in place: x [n_rows, head_dim] (rows = tokens x heads), w [head_dim].
// One warp per row.
extern "C" __global__ void rms_norm_heads(float* x, const float* w, float eps, int n_rows,
                                          int head_dim) {
    PDL_START();
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    int lane = threadIdx.x & 31;
    float* xr = x + (u64)row * head_dim;
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) xr[i] = xr[i] * scale * w[i];
}

// x *= s over n elements.
extern "C" __global__ void scale_act(float* x, float s, int n) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

// x = cap * tanh(x / cap) over n elements (logit soft-capping).
extern "C" __global__ void softcap(float* x, float cap, int n) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// x += y over n elements.
extern "C" __global__ void add(float* x, const float* y, int n) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// f32 -> bf16 over n elements (the GEMM's activation operand).
extern "C" __global__ void to_bf16(const float* x, u16* y, int n) {
    PDL_START();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(x[i]);
}

// Rotates x [n_tok, n_head, head_dim] in place at positions inputs[0] + t. One thread per
// rotated pair; neox selects the (i, i + half) pairing instead of (2i, 2i + 1).
extern "C" __global__ void rope(float* x, const u32* inputs, const float* inv_freq, int n_tok,
                                int n_head, int head_dim, int half, int neox) {
    PDL_START();
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    int per_tok = n_head * half;
    if (idx >= n_tok * per_tok) return;
    int t = idx / per_tok;
    int r = idx - t * per_tok;
    int h = r / half;
    int i = r - h * half;
    double theta = (double)(inputs[0] + t) * (double)inv_freq[i];
    double s, c;
    sincos(theta, &s, &c);
    float sn = (float)s, cs = (float)c;
    float* head = x + ((u64)t * n_head + h) * head_dim;
    int a = neox ? i : 2 * i;
    int b = neox ? i + half : 2 * i + 1;
    float x0 = head[a], x1 = head[b];
    head[a] = x0 * cs - x1 * sn;
    head[b] = x0 * sn + x1 * cs;
}

// RoPE fused with the KV-cache write, for one element pair: pair i of head h of token t (at
// position `pos`, its keys and values going to cache slot `slot`). Pair i < half is a rotated
// pair ((i, i + half) with neox, else (2i, 2i + 1)); the rest pass through unrotated (dims
// 2 * half.. of a partial rotary; half = 0 stores k and v as they are). Heads h < n_head are
// q heads (rotated in place), the rest kv heads (k rotated and v copied into the cache).
__device__ __forceinline__ void rope_kv_pair(float* q, const float* k, const float* v, u16* kc,
                                             u16* vc, const float* inv_freq, int t, int h,
                                             int i, u32 pos, u32 slot, int n_head, int n_kv,
                                             int head_dim, int half, int neox, int n_ctx) {
    int a, b;
    float sn = 0.0f, cs = 1.0f;
    if (i < half) {
        double theta = (double)pos * (double)inv_freq[i];
        double ds, dc;
        sincos(theta, &ds, &dc);
        sn = (float)ds;
        cs = (float)dc;
        a = neox ? i : 2 * i;
        b = neox ? i + half : 2 * i + 1;
    } else {
        a = 2 * i;
        b = 2 * i + 1;
    }
    if (h < n_head) {
        if (i >= half) return;
        float* head = q + ((u64)t * n_head + h) * head_dim;
        float x0 = head[a], x1 = head[b];
        head[a] = x0 * cs - x1 * sn;
        head[b] = x0 * sn + x1 * cs;
        return;
    }
    h -= n_head;
    u64 src = ((u64)t * n_kv + h) * head_dim;
    float x0 = k[src + a], x1 = k[src + b];
    u64 dst = ((u64)h * n_ctx + slot) * head_dim;
    kc[dst + a] = f2h(x0 * cs - x1 * sn);
    kc[dst + b] = f2h(x0 * sn + x1 * cs);
    vc[dst + a] = f2h(v[src + a]);
    vc[dst + b] = f2h(v[src + b]);
}

// RoPE fused with the KV-cache write: rotates q [n_tok, n_head, head_dim] in place, and writes
// k (rotated) and v [n_tok, n_kv, head_dim] into one layer's f16 cache [n_kv][n_ctx][head_dim]
// at positions (= slots) inputs[0] + t. One thread per element pair of a head
// (`rope_kv_pair`); threads cover the q heads, then the kv heads.
extern "C" __global__ void rope_kv(float* q, const float* k, const float* v, u16* kc, u16* vc,
                                   const u32* inputs, const float* inv_freq, int n_tok,
                                   int n_head, int n_kv, int head_dim, int half, int neox,
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
    u32 p = inputs[0] + t;
    rope_kv_pair(q, k, v, kc, vc, inv_freq, t, h, i, p, p, n_head, n_kv, head_dim, half, neox,
                 n_ctx);
}

// ---------------------------------------------------------------------------------------
// KV cache element types (the cache write into a q8_0 cache is in kv_quant.cu).

#define KV_F16 0
#define KV_Q8 1

// Bytes of one KV head's region in a layer of the cache (n_ctx rows of d values): f16 two
// bytes a value; q8_0 the quants [n_ctx][d] i8 then the scales [n_ctx][d / 32] f16, padded to
// 16 bytes (so every head's quants start 16-byte aligned). The host's `kv_head_bytes` twin.
template <int KV>
__device__ __forceinline__ u64 kv_head_bytes(int n_ctx, int d) {
    if (KV == KV_F16) return (u64)n_ctx * d * 2;
    return ((u64)n_ctx * (d + d / 16) + 15) & ~(u64)15;
}

// Values i..i+N (N = 1, 2 or 8; i % N == 0) of row `slot` of one KV head's region `head`
// (`kv_head_bytes` bytes, n_ctx rows of D values) widened to f32: the one place the attention
// kernels read the cache. q8_0 widens q * d exactly (an i8 times an f16 fits an f32).
template <int KV, int D, int N>
__device__ __forceinline__ void kv_load(const u8* head, int n_ctx, u32 slot, int i, float* out) {
    if (KV == KV_F16) {
        const u16* r = (const u16*)head + (u64)slot * D + i;
        if (N == 8) {
            uint4 w = *(const uint4*)r;
            u32 kw[4] = {w.x, w.y, w.z, w.w};
            _Pragma("unroll") for (int j = 0; j < 4; j++) {
                out[2 * j] = h2f((u16)(kw[j] & 0xFFFF));
                out[2 * j + 1] = h2f((u16)(kw[j] >> 16));
            }
        } else if (N == 2) {
            u32 w = *(const u32*)r;
            out[0] = h2f((u16)(w & 0xFFFF));
            out[1] = h2f((u16)(w >> 16));
        } else {
            out[0] = h2f(*r);
        }
    } else {
        const i8* r = (const i8*)head + (u64)slot * D + i;
        float d = h2f(*((const u16*)(head + (u64)n_ctx * D) + (u64)slot * (D / 32) + i / 32));
        if (N == 8) {
            uint2 w = *(const uint2*)r;
            u32 kw[2] = {w.x, w.y};
            _Pragma("unroll") for (int j = 0; j < 8; j++)
                out[j] = (float)(i8)((kw[j >> 2] >> (8 * (j & 3))) & 0xFF) * d;
        } else if (N == 2) {
            u32 w = *(const u16*)r;
            out[0] = (float)(i8)(w & 0xFF) * d;
            out[1] = (float)(i8)(w >> 8) * d;
        } else {
            out[0] = (float)*r * d;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Attention over the head-major cache (f16 or q8_0, the template parameter KV; rows read
// through `kv_load`). Scores are scaled by `scale` (1/sqrt(head_dim) unless the model
// overrides it). A query head h reads KV head h / group. `window` > 0 is a sliding window: a
// query at position p sees keys p - window + 1..=p only.

#define ATT_CHUNK_MIN 32   // decode split positions: a multiple of this (one per lane)
#define ATT_CHUNK_MAX 256  // and at most this
#define ATT_THREADS 256
#define MAX_GROUP 8

// First position a query at position `p` sees.
__device__ __forceinline__ int att_lo(int p, int window) {
    return window > 0 ? max(0, p - window + 1) : 0;
}

// The cache slot of position p: p itself in a sequence's private cache, else through its block
// table (position p in block table[p / bs], `bs` slots per block) in the shared paged pool.
template <bool PAGED>
__device__ __forceinline__ u32 kv_slot(int p, const u32* table, int bs) {
    if (!PAGED) return (u32)p;
    return table[p / bs] * (u32)bs + (u32)(p % bs);
}

// Positions per decode split for n_pos cached positions: the host's `decode_chunk`
// (next power of two of n_pos / 64, clamped to [ATT_CHUNK_MIN, ATT_CHUNK_MAX]), so a paged
// row splits exactly as it would alone.
__device__ __forceinline__ int att_chunk(int n_pos) {
    int want = n_pos / 64, c = 1;
    while (c < want) c <<= 1;
    return min(max(c, ATT_CHUNK_MIN), ATT_CHUNK_MAX);
}

// s[g] += q_g · k for every query head g of a group: k the key row `slot` of a KV head's
// region kb, q [G][D] in shared memory (already scaled).
template <int KV, int D, int G>
__device__ __forceinline__ void key_scores(const u8* kb, int n_ctx, u32 slot,
                                           const float (*qs)[D], float* s) {
    for (int i = 0; i < D; i += 8) {
        float kf[8];
        kv_load<KV, D, 8>(kb, n_ctx, slot, i, kf);
        _Pragma("unroll") for (int g = 0; g < G; g++)
            for (int j = 0; j < 8; j++) s[g] += qs[g][i + j] * kf[j];
    }
}

// Decode (one query token at position inputs[0]), split-K: block (kv head, split) of
// ATT_THREADS threads handles positions [split * chunk, +chunk) (chunk a multiple of 32, at
// most ATT_CHUNK_MAX, chosen by the host from the depth) for every query head of its group
// and writes an unnormalized partial (m, l, o[D]) per query head; `attn_combine` merges the
// active splits (those that hold a visible position; the rest return at once).
// Scores: ATT_THREADS / 32 threads per position, 32 positions at a time, each thread a slice
// of the dims. Softmax: a warp per query head. Values: a thread per two dims (one 4-byte load),
// position groups of 2 * ATT_THREADS / D threads summed in a fixed order through shared memory
// (deterministic: a graph replay gives the eager launch's bits).
// part_o [n_head][n_split][D], part_ml [n_head][n_split] float2.
template <int D, int G, bool PAGED, int KV>
__device__ void attn_split(const float* q, const u8* kc, const u8* vc, const u32* inputs,
                           float* part_o, float2* part_ml, int n_head, int n_ctx, int n_split,
                           int chunk, float scale, int window, float* sm, const u32* table,
                           int bs) {
    // Scores: TPP threads per position, DPT (a multiple of 8) dims each, PPI positions at a time.
    const int TPP = D % 64 == 0 ? 8 : (D % 32 == 0 ? 4 : 2);
    const int DPT = D / TPP;
    const int PPI = ATT_THREADS / TPP;
    const int NPG = 2 * ATT_THREADS / D;  // position groups (values)
    int kvh = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
    int n_pos = inputs[0] + 1;
    int lo = att_lo(n_pos - 1, window);
    int p0 = split * chunk;
    if (p0 >= n_pos || p0 + chunk <= lo) return;
    int n_here = min(chunk, n_pos - p0);
    int skip = max(0, lo - p0);  // leading positions outside the window
    float(*qs)[D] = (float(*)[D])sm;                                   // [G][D]
    float(*sc)[ATT_CHUNK_MAX] = (float(*)[ATT_CHUNK_MAX])(sm + G * D);  // [G][ATT_CHUNK_MAX]
    float(*po)[G][D] = (float(*)[G][D])(sm + G * (D + ATT_CHUNK_MAX));  // [NPG][G][D]
    for (int i = tid; i < G * D; i += ATT_THREADS) qs[i / D][i % D] = q[kvh * G * D + i] * scale;
    __syncthreads();
    const u8* kb = kc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    const u8* vb = vc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    int pl = tid / TPP, part = tid % TPP;
    for (int c = 0; c < n_here; c += PPI) {
        int pp = c + pl;
        float s[G];
        _Pragma("unroll") for (int g = 0; g < G; g++) s[g] = 0.0f;
        if (pp < n_here) {
            u32 ks = kv_slot<PAGED>(p0 + pp, table, bs);
            _Pragma("unroll") for (int i = 0; i < DPT; i += 8) {
                float kf[8];
                kv_load<KV, D, 8>(kb, n_ctx, ks, part * DPT + i, kf);
                _Pragma("unroll") for (int g = 0; g < G; g++)
                    _Pragma("unroll") for (int j = 0; j < 8; j++)
                        s[g] += qs[g][part * DPT + i + j] * kf[j];
            }
        }
        _Pragma("unroll") for (int o = TPP / 2; o > 0; o >>= 1)
            _Pragma("unroll") for (int g = 0; g < G; g++) s[g] += __shfl_xor_sync(FULL, s[g], o);
        if (part == 0 && pp < n_here)
            _Pragma("unroll") for (int g = 0; g < G; g++) sc[g][pp] = pp >= skip ? s[g] : -INFINITY;
    }
    __syncthreads();
    int warp = tid >> 5, lane = tid & 31;
    for (int g = warp; g < G; g += ATT_THREADS / 32) {
        float m = -INFINITY;
        for (int p = lane; p < n_here; p += 32) m = fmaxf(m, sc[g][p]);
        m = warp_max(m);
        float l = 0.0f;
        for (int p = lane; p < n_here; p += 32) {
            float e = p >= skip ? expf(sc[g][p] - m) : 0.0f;
            sc[g][p] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) part_ml[(kvh * G + g) * n_split + split] = make_float2(m, l);
    }
    __syncthreads();
    int d = (tid % (D / 2)) * 2, pg = tid / (D / 2);  // pg >= NPG: idle (D not a power of 2)
    float o0[G], o1[G];
    _Pragma("unroll") for (int g = 0; g < G; g++) o0[g] = o1[g] = 0.0f;
    _Pragma("unroll 4") for (int p = skip + pg; pg < NPG && p < n_here; p += NPG) {
        float vv[2];
        kv_load<KV, D, 2>(vb, n_ctx, kv_slot<PAGED>(p0 + p, table, bs), d, vv);
        float v0 = vv[0], v1 = vv[1];
        _Pragma("unroll") for (int g = 0; g < G; g++) {
            float e = sc[g][p];
            o0[g] += e * v0;
            o1[g] += e * v1;
        }
    }
    if (pg < NPG)
        _Pragma("unroll") for (int g = 0; g < G; g++) {
            po[pg][g][d] = o0[g];
            po[pg][g][d + 1] = o1[g];
        }
    __syncthreads();
    for (int i = tid; i < G * D; i += ATT_THREADS) {
        int g = i / D, dd = i % D;
        float r = 0.0f;
        _Pragma("unroll") for (int j = 0; j < NPG; j++) r += po[j][g][dd];
        part_o[((u64)(kvh * G + g) * n_split + split) * D + dd] = r;
    }
}

// Merges the active splits of `attn_split` into out [n_head * D] (and its q8 shadow when
// do_q). Block per query head, D threads.
template <int D>
__device__ void attn_combine(const float* part_o, const float2* part_ml, const u32* inputs,
                             float* out, i8* q, float2* ds, int n_split, int chunk, int do_q,
                             int window) {
    int h = blockIdx.x, d = threadIdx.x;
    int n_pos = inputs[0] + 1;
    int s_hi = min(n_split, (n_pos + chunk - 1) / chunk);
    int s_lo = att_lo(n_pos - 1, window) / chunk;
    const float2* ml = part_ml + (u64)h * n_split;
    float M = -INFINITY;
    for (int s = s_lo; s < s_hi; s++) M = fmaxf(M, ml[s].x);
    float L = 0.0f, acc = 0.0f;
    for (int s = s_lo; s < s_hi; s++) {
        float2 v = ml[s];
        float f = expf(v.x - M);
        L += f * v.y;
        acc += f * part_o[((u64)h * n_split + s) * D + d];
    }
    float r = L > 0.0f ? acc / L : 0.0f;
    out[h * D + d] = r;
    if (do_q) {
        int b = (h * D + d) >> 5;
        q8_block(r, q + b * 32, ds + b);
    }
}

// Prompt attention on CUDA cores (the fallback of `attn_flash`): one warp per (query token,
// KV head), covering every query head of the group, with an online softmax over 32-position
// chunks (lane per position for the scores, lane per dims for the values). Token t sits at
// position inputs[0] + t and sees positions att_lo..=that. q [n_tok, n_head, D], out
// likewise; 4 warps per block.
template <int D, int G, bool PAGED, int KV>
__device__ void attn_prefill(const float* q, const u8* kc, const u8* vc, const u32* inputs,
                             float* out, int n_tok, int n_head, int n_ctx, float scale,
                             int window, float* sm, const u32* table, int bs) {
    const int group = G;
    const int PER = (D + 31) / 32;  // dims per lane (lanes past D idle when D < 32)
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.y * 4 + warp;
    int kvh = blockIdx.x;
    if (t >= n_tok) return;
    float(*qs)[D] = (float(*)[D])(sm + warp * G * D);  // sm: [4][G][D]
    const float* qt = q + ((u64)t * n_head + kvh * group) * D;
    _Pragma("unroll") for (int g = 0; g < group; g++)
        for (int i = lane; i < D; i += 32) qs[g][i] = qt[g * D + i] * scale;
    __syncwarp();
    int n_pos = inputs[0] + t + 1;
    bool lane_ok = lane < D;
    int lo = att_lo(n_pos - 1, window);
    const u8* kb = kc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    const u8* vb = vc + (u64)kvh * kv_head_bytes<KV>(n_ctx, D);
    float m[G], l[G], o[G][PER];
    _Pragma("unroll") for (int g = 0; g < group; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        for (int i = 0; i < PER; i++) o[g][i] = 0.0f;
    }
    for (int p0 = lo & ~31; p0 < n_pos; p0 += 32) {
        int p = p0 + lane;
        bool ok = p < n_pos && p >= lo;
        float s[G];
        _Pragma("unroll") for (int g = 0; g < group; g++) s[g] = 0.0f;
        if (ok) {
            key_scores<KV, D, G>(kb, n_ctx, kv_slot<PAGED>(p, table, bs), qs, s);
        }
        int n_here = min(32, n_pos - p0);
        _Pragma("unroll") for (int g = 0; g < group; g++) {
            float sv = ok ? s[g] : -INFINITY;
            float cm = warp_max(sv);
            float nm = fmaxf(m[g], cm);
            float corr = expf(m[g] - nm);
            float e = ok ? expf(sv - nm) : 0.0f;
            l[g] = l[g] * corr + warp_sum(e);
            m[g] = nm;
            for (int i = 0; i < PER; i++) o[g][i] *= corr;
            for (int j = 0; j < n_here; j++) {
                float ej = __shfl_sync(FULL, e, j);
                if (ej == 0.0f) continue;
                u32 vs = kv_slot<PAGED>(p0 + j, table, bs);
                if (lane_ok)
                    for (int i = 0; i < PER; i++) {
                        float vf;
                        kv_load<KV, D, 1>(vb, n_ctx, vs, lane + 32 * i, &vf);
                        o[g][i] += ej * vf;
                    }
            }
        }
    }
    float* ot = out + ((u64)t * n_head + kvh * group) * D;
    _Pragma("unroll") for (int g = 0; g < group; g++)
        if (lane_ok)
            for (int i = 0; i < PER; i++) ot[g * D + lane + 32 * i] = o[g][i] / l[g];
}

#define ATT_GROUPS(CALL, ...)                                                                  \
    switch (group) {                                                                           \
        case 1: CALL(1, __VA_ARGS__); break;                                                   \
        case 2: CALL(2, __VA_ARGS__); break;                                                   \
        case 3: CALL(3, __VA_ARGS__); break;                                                   \
        case 4: CALL(4, __VA_ARGS__); break;                                                   \
        case 5: CALL(5, __VA_ARGS__); break;                                                   \
        case 6: CALL(6, __VA_ARGS__); break;                                                   \
        case 7: CALL(7, __VA_ARGS__); break;                                                   \
        default: CALL(8, __VA_ARGS__); break;                                                  \
    }
#define SPLIT_ARGS q, kc, vc, inputs, part_o, part_ml, n_head, n_ctx, n_split, chunk, scale, window, sm, table, bs
#define PREFILL_ARGS q, kc, vc, inputs, out, n_tok, n_head, n_ctx, scale, window, sm, table, bs
#define SPLIT_G(G, D, PAGED, KV) attn_split<D, G, PAGED, KV>(SPLIT_ARGS)
#define PREFILL_G(G, D, PAGED, KV) attn_prefill<D, G, PAGED, KV>(PREFILL_ARGS)

// `group` (1..=MAX_GROUP, checked on the host) picks the instantiation. Shared memory is
// declared once per kernel, sized for MAX_GROUP (each instantiation's own arrays would add up).
// The paged twins (over the server's shared pool) are in paged.cu. SUF names the cache's
// element type: none for f16, `_q8` for q8_0 (head sizes multiple of 32 only).
#define INSTANTIATE_ATTN(D, SUF, KV)                                                           \
    extern "C" __global__ void attn_split_##D##SUF(const float* q, const u8* kc, const u8* vc, \
                                                   const u32* inputs, float* part_o,           \
                                                   float2* part_ml, int n_head, int group,     \
                                                   int n_ctx, int n_split, int chunk,          \
                                                   float scale, int window) {                  \
        PDL_START();                                                                           \
        __shared__ float sm[MAX_GROUP * (D + ATT_CHUNK_MAX + 2 * ATT_THREADS)];                \
        const u32* table = nullptr;                                                            \
        int bs = 1;                                                                            \
        ATT_GROUPS(SPLIT_G, D, false, KV)                                                      \
    }                                                                                          \
    extern "C" __global__ void attn_prefill_##D##SUF(                                          \
        const float* q, const u8* kc, const u8* vc, const u32* inputs, float* out, int n_tok,  \
        int n_head, int group, int n_ctx, float scale, int window) {                           \
        __shared__ float sm[4 * MAX_GROUP * D];                                                \
        const u32* table = nullptr;                                                            \
        int bs = 1;                                                                            \
        ATT_GROUPS(PREFILL_G, D, false, KV)                                                    \
    }
#define INSTANTIATE_COMBINE(D)                                                                 \
    extern "C" __global__ void attn_combine_##D(const float* part_o, const float2* part_ml,    \
                                                const u32* inputs, float* out, i8* q,          \
                                                float2* ds, int n_split, int chunk, int do_q,  \
                                                int window) {                                  \
        PDL_START();                                                                           \
        attn_combine<D>(part_o, part_ml, inputs, out, q, ds, n_split, chunk, do_q, window);    \
    }

INSTANTIATE_ATTN(16, , KV_F16)
INSTANTIATE_ATTN(32, , KV_F16)
INSTANTIATE_ATTN(64, , KV_F16)
INSTANTIATE_ATTN(96, , KV_F16)
INSTANTIATE_ATTN(128, , KV_F16)
INSTANTIATE_ATTN(256, , KV_F16)
INSTANTIATE_ATTN(32, _q8, KV_Q8)
INSTANTIATE_ATTN(64, _q8, KV_Q8)
INSTANTIATE_ATTN(96, _q8, KV_Q8)
INSTANTIATE_ATTN(128, _q8, KV_Q8)
INSTANTIATE_ATTN(256, _q8, KV_Q8)
INSTANTIATE_COMBINE(16)
INSTANTIATE_COMBINE(32)
INSTANTIATE_COMBINE(64)
INSTANTIATE_COMBINE(96)
INSTANTIATE_COMBINE(128)
INSTANTIATE_COMBINE(256)

// ---------------------------------------------------------------------------------------
// Greedy pick on the device.

// out[r] = index of the largest x[r, :] (x [n_rows, width]); NaN counts as -inf, +inf as
// FLT_MAX, ties go to the lowest index (the host sampler's greedy order). One block per row.
#define ARGMAX_THREADS 1024
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}
// The warp's best (value, index) into every lane.
__device__ __forceinline__ void argmax_warp(float& bv, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL, bv, o);
        int oi = __shfl_xor_sync(FULL, bi, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}
extern "C" __global__ void argmax_rows(const float* x, int width, u32* out) {
    PDL_START();
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const float* row = x + (u64)blockIdx.x * width;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = row[i];
        v = v != v ? -INFINITY : fminf(v, 3.402823466e38f);
        if (argmax_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    argmax_warp(bv, bi);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : 0x7fffffff;
        argmax_warp(bv, bi);
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0u : (u32)bi;
    }
}
