// Runs `attn_decode` (kernels/attn_decode.cu) under the CPU shim on small problems (private and
// paged caches, head sizes 64/128/256, GQA groups 1-8, windows, split lengths 32-256) and checks
// the combined output against an f64 reference. Unused slots and positions below the window hold
// NaN, so a stray read fails. Dev tool: `bash tools/attn_decode_emu/run.sh`.
#include "shim.h"
#include "kernel.inc"
#include <cstdio>
#include <random>

static u16 f2h_exact(float x) {  // x = k / 1024, |k| <= 1024: exact in f16
    if (x == 0) return 0;
    u16 s = x < 0 ? 0x8000 : 0;
    float a = std::fabs(x);
    int e;
    float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int E = e - 1 + 15;
    int M = (int)std::lround((m * 2 - 1) * 1024);
    return s | (u16)(E << 10) | (u16)M;
}

template <int D, int G, bool PAGED>
void launch(const float* q, const u16* kc, const u16* vc, u32 pos, float* part_o, float2* part_ml,
            int n_kv, int n_ctx, int n_split, int chunk, float scale, int window, const u32* table,
            int bs) {
    u32 inputs[1] = {pos};
    for (int bx = 0; bx < n_kv; bx++)
        for (int by = 0; by < n_split; by++) {
            blockIdx = {bx, by, 0};
            std::barrier<> bb(128);
            block_bar = &bb;
            std::barrier<> w0(32), w1(32), w2(32), w3(32);
            warp_bar[0] = &w0; warp_bar[1] = &w1; warp_bar[2] = &w2; warp_bar[3] = &w3;
            std::vector<std::thread> th;
            for (int t = 0; t < 128; t++)
                th.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    attn_decode<D, G, PAGED>(q, kc, vc, inputs, part_o, part_ml, n_ctx, n_split,
                                             chunk, scale, window, table, bs);
                });
            for (auto& x : th) x.join();
        }
}

template <int D, int G, bool PAGED>
int check(int n_kv, int depth, int chunk, int window, int bs, unsigned seed) {
    std::mt19937 rng(seed);
    auto rv = [&] { return (int)(rng() % 2049) - 1024; };
    int n_head = n_kv * G;
    int n_pos = depth;
    int n_blocks = PAGED ? (n_pos + bs - 1) / bs + 3 : 0;
    int n_ctx = PAGED ? n_blocks * bs : n_pos + 3;
    std::vector<u32> table;
    if (PAGED) {
        std::vector<u32> perm(n_blocks);
        for (int i = 0; i < n_blocks; i++) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        table = perm;
    }
    std::vector<u16> kc((size_t)n_kv * n_ctx * D, 0x7e00), vc((size_t)n_kv * n_ctx * D, 0x7e00);  // NaN
    std::vector<float> kf((size_t)n_kv * n_pos * D), vf((size_t)n_kv * n_pos * D);
    for (int h = 0; h < n_kv; h++)
        for (int p = 0; p < n_pos; p++) {
            u32 slot = PAGED ? table[p / bs] * bs + p % bs : p;
            for (int d = 0; d < D; d++) {
                float k = rv() / 1024.0f, v = rv() / 1024.0f;
                kc[((size_t)h * n_ctx + slot) * D + d] = f2h_exact(k);
                vc[((size_t)h * n_ctx + slot) * D + d] = f2h_exact(v);
                kf[((size_t)h * n_pos + p) * D + d] = k;
                vf[((size_t)h * n_pos + p) * D + d] = v;
            }
        }
    // Positions below the window hold NaN in a copy: they must never be read.
    int lo = att_lo(n_pos - 1, window);
    for (int h = 0; h < n_kv; h++)
        for (int p = 0; p < lo; p++) {
            u32 slot = PAGED ? table[p / bs] * bs + p % bs : p;
            for (int d = 0; d < D; d++) kc[((size_t)h * n_ctx + slot) * D + d] = vc[((size_t)h * n_ctx + slot) * D + d] = 0x7e00;
        }
    std::vector<float> q((size_t)n_head * D);
    for (auto& x : q) x = rv() / 1024.0f;
    float scale = 1.0f / std::sqrt((float)D);
    int n_split = (n_ctx + chunk - 1) / chunk;
    std::vector<float> part_o((size_t)n_head * n_split * D, NAN);
    std::vector<float2> part_ml((size_t)n_head * n_split, {NAN, NAN});
    launch<D, G, PAGED>(q.data(), kc.data(), vc.data(), n_pos - 1, part_o.data(), part_ml.data(),
                        n_kv, n_ctx, n_split, chunk, scale, window, PAGED ? table.data() : nullptr, bs);
    int s_hi = std::min(n_split, (n_pos + chunk - 1) / chunk), s_lo = lo / chunk;
    double worst = 0;
    for (int h = 0; h < n_head; h++) {
        int kvh = h / G;
        // host combine (attn_combine)
        float M = -INFINITY;
        for (int s = s_lo; s < s_hi; s++) M = fmaxf(M, part_ml[h * n_split + s].x);
        std::vector<double> ref(D, 0.0);
        std::vector<double> sc;
        double m = -1e300;
        for (int p = lo; p < n_pos; p++) {
            double a = 0;
            for (int d = 0; d < D; d++) a += (double)(q[h * D + d] * scale) * kf[((size_t)kvh * n_pos + p) * D + d];
            sc.push_back(a);
            m = std::max(m, a);
        }
        double l = 0;
        for (int p = lo; p < n_pos; p++) {
            double e = std::exp(sc[p - lo] - m);
            l += e;
            for (int d = 0; d < D; d++) ref[d] += e * vf[((size_t)kvh * n_pos + p) * D + d];
        }
        for (int d = 0; d < D; d++) {
            float L = 0, acc = 0;
            for (int s = s_lo; s < s_hi; s++) {
                float2 v = part_ml[h * n_split + s];
                float f = expf(v.x - M);
                L += f * v.y;
                acc += f * part_o[((size_t)h * n_split + s) * D + d];
            }
            double got = acc / L, want = ref[d] / l;
            double err = std::fabs(got - want);
            if (!(err <= worst)) worst = err;  // NaN sticks
        }
    }
    bool ok = worst <= 2e-5;
    printf("%s D %d G %d n_kv %d depth %d chunk %d window %d paged %d bs %d: max err %.3g\n",
           ok ? "ok  " : "FAIL", D, G, n_kv, depth, chunk, window, PAGED, bs, worst);
    return ok ? 0 : 1;
}

int main() {
    int bad = 0;
    bad += check<64, 1, false>(2, 1, 32, 0, 1, 1);
    bad += check<64, 3, false>(2, 33, 32, 0, 1, 2);
    bad += check<128, 3, false>(1, 100, 64, 0, 1, 3);
    bad += check<128, 4, true>(2, 7, 32, 0, 5, 4);
    bad += check<128, 8, true>(1, 300, 256, 77, 5, 5);
    bad += check<256, 3, false>(1, 70, 64, 5, 1, 6);
    bad += check<256, 8, true>(1, 97, 32, 0, 16, 7);
    bad += check<64, 8, false>(1, 700, 256, 0, 1, 8);
    bad += check<64, 4, true>(2, 261, 64, 40, 16, 9);
    bad += check<128, 1, false>(1, 3, 32, 2, 1, 10);
    bad += check<128, 6, false>(1, 530, 256, 300, 1, 11);
    bad += check<64, 2, true>(3, 64, 32, 0, 1, 12);      // blocks of one slot, depth = 2 splits
    bad += check<128, 5, false>(1, 65, 32, 1, 1, 13);    // window 1: the query's own row only
    bad += check<256, 7, true>(1, 257, 256, 0, 16, 14);  // one row past a full split
    bad += check<128, 2, true>(2, 129, 64, 64, 5, 15);   // window = chunk
    printf(bad ? "%d FAILED\n" : "all ok\n", bad);
    return bad;
}
