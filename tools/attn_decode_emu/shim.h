// CPU emulation shim for kernels/attn_decode.cu (see run.sh): one block at a time, a std::thread
// per CUDA thread; barriers stand in for __syncthreads and warp shuffles, cp.async copies at once.
#include <barrier>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <thread>
#include <vector>
#include <algorithm>
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define __device__
#define __forceinline__ inline
#define FULL 0xffffffffu
#define MAX_GROUP 8
struct uint4 { u32 x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct Dim { int x = 0, y = 0, z = 0; };
thread_local Dim threadIdx;
Dim blockIdx;
std::barrier<>* block_bar;
std::barrier<>* warp_bar[4];
float xch[4][32];
inline void __syncthreads() { block_bar->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    xch[w][l] = v;
    warp_bar[w]->arrive_and_wait();
    float r = xch[w][l ^ off];
    warp_bar[w]->arrive_and_wait();
    return r;
}
inline float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o); return v; }
inline float warp_max(float v) { for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o)); return v; }
inline float h2f(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) f = std::ldexp((float)m, -24);
    else if (e == 31) f = m ? NAN : INFINITY;
    else f = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -f : f;
}
inline void cp_async16(u16* dst, const u16* src, bool ok) {
    if (ok) memcpy(dst, src, 16); else memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N> inline void cp_async_wait() {}
inline int att_lo(int p, int window) { return window > 0 ? std::max(0, p - window + 1) : 0; }
template <bool PAGED> inline u32 kv_slot(int p, const u32* table, int bs) {
    if (!PAGED) return (u32)p;
    return table[p / bs] * (u32)bs + (u32)(p % bs);
}
using std::min; using std::max;
