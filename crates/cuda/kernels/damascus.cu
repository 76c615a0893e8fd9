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
// * The KV cache is f16, head-major: [layer][n_head_kv][n_ctx][head_dim].
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
#define PDL_START() \
    do {            \
        PDL_TRIGGER(); \
        PDL_WAIT(); \
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
// 0), and its second level (`quantize_q8_res`, the same bits) into q2/ds2 when q2 is given. Grid (blocks per token, n_tok): every block sums the squares of its token's whole row
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

// ---------------------------------------------------------------------------------------
// Attention over the f16 head-major cache. Scores are scaled by `scale` (1/sqrt(head_dim)
// unless the model overrides it). A query head h reads KV head h / group. `window` > 0 is a
// sliding window: a query at position p sees keys p - window + 1..=p only.

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

// s[g] += q_g · k for every query head g of a group: k one f16 key row, q [G][D] in shared
// memory (already scaled).
template <int D, int G>
__device__ __forceinline__ void key_scores(const u16* kr, const float (*qs)[D], float* s) {
    for (int i = 0; i < D; i += 8) {
        uint4 kv = *(const uint4*)(kr + i);
        u32 kw[4] = {kv.x, kv.y, kv.z, kv.w};
        float kf[8];
        for (int j = 0; j < 4; j++) {
            kf[2 * j] = h2f((u16)(kw[j] & 0xFFFF));
            kf[2 * j + 1] = h2f((u16)(kw[j] >> 16));
        }
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
template <int D, int G, bool PAGED>
__device__ void attn_split(const float* q, const u16* kc, const u16* vc, const u32* inputs,
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
    const u16* kb = kc + (u64)kvh * n_ctx * D;
    const u16* vb = vc + (u64)kvh * n_ctx * D;
    int pl = tid / TPP, part = tid % TPP;
    for (int c = 0; c < n_here; c += PPI) {
        int pp = c + pl;
        float s[G];
        _Pragma("unroll") for (int g = 0; g < G; g++) s[g] = 0.0f;
        if (pp < n_here) {
            const u16* kr = kb + (u64)kv_slot<PAGED>(p0 + pp, table, bs) * D + part * DPT;
            _Pragma("unroll") for (int i = 0; i < DPT; i += 8) {
                uint4 kv = *(const uint4*)(kr + i);
                u32 kw[4] = {kv.x, kv.y, kv.z, kv.w};
                float kf[8];
                _Pragma("unroll") for (int j = 0; j < 4; j++) {
                    kf[2 * j] = h2f((u16)(kw[j] & 0xFFFF));
                    kf[2 * j + 1] = h2f((u16)(kw[j] >> 16));
                }
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
        u32 vw = *(const u32*)(vb + (u64)kv_slot<PAGED>(p0 + p, table, bs) * D + d);
        float v0 = h2f((u16)(vw & 0xFFFF)), v1 = h2f((u16)(vw >> 16));
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
template <int D, int G, bool PAGED>
__device__ void attn_prefill(const float* q, const u16* kc, const u16* vc, const u32* inputs,
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
    const u16* kb = kc + (u64)kvh * n_ctx * D;
    const u16* vb = vc + (u64)kvh * n_ctx * D;
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
            key_scores<D, G>(kb + (u64)kv_slot<PAGED>(p, table, bs) * D, qs, s);
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
                const u16* vr = vb + (u64)kv_slot<PAGED>(p0 + j, table, bs) * D;
                if (lane_ok)
                    for (int i = 0; i < PER; i++) o[g][i] += ej * h2f(vr[lane + 32 * i]);
            }
        }
    }
    float* ot = out + ((u64)t * n_head + kvh * group) * D;
    _Pragma("unroll") for (int g = 0; g < group; g++)
        if (lane_ok)
            for (int i = 0; i < PER; i++) ot[g * D + lane + 32 * i] = o[g][i] / l[g];
}

#define ATT_GROUPS(CALL)                                                                       \
    switch (group) {                                                                           \
        case 1: CALL(1); break;                                                                \
        case 2: CALL(2); break;                                                                \
        case 3: CALL(3); break;                                                                \
        case 4: CALL(4); break;                                                                \
        case 5: CALL(5); break;                                                                \
        case 6: CALL(6); break;                                                                \
        case 7: CALL(7); break;                                                                \
        default: CALL(8); break;                                                               \
    }

// `group` (1..=MAX_GROUP, checked on the host) picks the instantiation. Shared memory is
// declared once per kernel, sized for MAX_GROUP (each instantiation's own arrays would add up).
// The paged twins (over the server's shared pool) are in paged.cu.
#define INSTANTIATE_ATTN(D)                                                                    \
    extern "C" __global__ void attn_split_##D(const float* q, const u16* kc, const u16* vc,    \
                                              const u32* inputs, float* part_o,                \
                                              float2* part_ml, int n_head, int group,          \
                                              int n_ctx, int n_split, int chunk, float scale,  \
                                              int window) {                                    \
        PDL_START();                                                                           \
        __shared__ float sm[MAX_GROUP * (D + ATT_CHUNK_MAX + 2 * ATT_THREADS)];                \
        const u32* table = nullptr;                                                            \
        int bs = 1;                                                                            \
        ATT_GROUPS(SPLIT_##D)                                                                  \
    }                                                                                          \
    extern "C" __global__ void attn_combine_##D(const float* part_o, const float2* part_ml,    \
                                                const u32* inputs, float* out, i8* q,          \
                                                float2* ds, int n_split, int chunk, int do_q,  \
                                                int window) {                                  \
        PDL_START();                                                                           \
        attn_combine<D>(part_o, part_ml, inputs, out, q, ds, n_split, chunk, do_q, window);    \
    }                                                                                          \
    extern "C" __global__ void attn_prefill_##D(const float* q, const u16* kc, const u16* vc,  \
                                                const u32* inputs, float* out, int n_tok,      \
                                                int n_head, int group, int n_ctx,              \
                                                float scale, int window) {                     \
        __shared__ float sm[4 * MAX_GROUP * D];                                                \
        const u32* table = nullptr;                                                            \
        int bs = 1;                                                                            \
        ATT_GROUPS(PREFILL_##D)                                                                \
    }

#define SPLIT_ARGS q, kc, vc, inputs, part_o, part_ml, n_head, n_ctx, n_split, chunk, scale, window, sm, table, bs
#define PREFILL_ARGS q, kc, vc, inputs, out, n_tok, n_head, n_ctx, scale, window, sm, table, bs
#define SPLIT_16(G) attn_split<16, G, false>(SPLIT_ARGS)
#define SPLIT_32(G) attn_split<32, G, false>(SPLIT_ARGS)
#define SPLIT_96(G) attn_split<96, G, false>(SPLIT_ARGS)
#define SPLIT_64(G) attn_split<64, G, false>(SPLIT_ARGS)
#define SPLIT_128(G) attn_split<128, G, false>(SPLIT_ARGS)
#define SPLIT_256(G) attn_split<256, G, false>(SPLIT_ARGS)
#define PREFILL_16(G) attn_prefill<16, G, false>(PREFILL_ARGS)
#define PREFILL_32(G) attn_prefill<32, G, false>(PREFILL_ARGS)
#define PREFILL_96(G) attn_prefill<96, G, false>(PREFILL_ARGS)
#define PREFILL_64(G) attn_prefill<64, G, false>(PREFILL_ARGS)
#define PREFILL_128(G) attn_prefill<128, G, false>(PREFILL_ARGS)
#define PREFILL_256(G) attn_prefill<256, G, false>(PREFILL_ARGS)

INSTANTIATE_ATTN(16)
INSTANTIATE_ATTN(32)
INSTANTIATE_ATTN(64)
INSTANTIATE_ATTN(96)
INSTANTIATE_ATTN(128)
INSTANTIATE_ATTN(256)

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
