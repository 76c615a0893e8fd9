// Compute peaks of this CPU: AVX-512 VNNI `vpdpbusd` (int8 TOPS) and fp32 FMA (TFLOPS) on
// zmm registers, for 1..N threads.
//
// Why not ../shared/tools/roofline.c's figures: its VNNI and FMA loops start eight
// accumulator chains from the same value with the same operands, so the compiler (gcc 12
// -O2 seen) merges them into one chain and the loop runs one `vpdpbusd` per iteration while
// counting eight. What it reports is 8 × the one-chain (latency-bound) rate, which is not the
// throughput peak (about 2× too high on a Zen 4 core, 1 `vpdpbusd` zmm per cycle). Here each
// chain starts from a different value and an empty `asm` pins all of them in registers every
// iteration, so ten independent chains really run (check: `objdump -d` shows ten).
//
//   build: cc -O2 -march=native -pthread tools/compute_peak.c -o /tmp/compute_peak
//   run:   /tmp/compute_peak [threads]
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define PIN(x) __asm__ volatile("" : "+v"(x))
#define ITERS 50000000L
typedef struct { int seed; double sink; } job_t;

static void *vnni(void *p) {
    job_t *j = p;
    __m512i w = _mm512_set1_epi8((char)(j->seed + 2)), u = _mm512_set1_epi8(3);
    __m512i a0 = _mm512_set1_epi32(1), a1 = _mm512_set1_epi32(2), a2 = _mm512_set1_epi32(3), a3 = _mm512_set1_epi32(4), a4 = _mm512_set1_epi32(5);
    __m512i a5 = _mm512_set1_epi32(6), a6 = _mm512_set1_epi32(7), a7 = _mm512_set1_epi32(8), a8 = _mm512_set1_epi32(9), a9 = _mm512_set1_epi32(10);
    for (long i = 0; i < ITERS; i++) {
        a0 = _mm512_dpbusd_epi32(a0, w, u); a1 = _mm512_dpbusd_epi32(a1, w, u); a2 = _mm512_dpbusd_epi32(a2, w, u);
        a3 = _mm512_dpbusd_epi32(a3, w, u); a4 = _mm512_dpbusd_epi32(a4, w, u); a5 = _mm512_dpbusd_epi32(a5, w, u);
        a6 = _mm512_dpbusd_epi32(a6, w, u); a7 = _mm512_dpbusd_epi32(a7, w, u); a8 = _mm512_dpbusd_epi32(a8, w, u);
        a9 = _mm512_dpbusd_epi32(a9, w, u);
        PIN(a0); PIN(a1); PIN(a2); PIN(a3); PIN(a4); PIN(a5); PIN(a6); PIN(a7); PIN(a8); PIN(a9);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    j->sink = _mm512_reduce_add_epi32(_mm512_add_epi32(s, _mm512_add_epi32(a8, a9)));
    return 0;
}

static void *fma32(void *p) {
    job_t *j = p;
    __m512 w = _mm512_set1_ps(0.999f + j->seed * 1e-9f), u = _mm512_set1_ps(0.001f);
    __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4), a4 = _mm512_set1_ps(5);
    __m512 a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8), a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10);
    for (long i = 0; i < ITERS; i++) {
        a0 = _mm512_fmadd_ps(a0, w, u); a1 = _mm512_fmadd_ps(a1, w, u); a2 = _mm512_fmadd_ps(a2, w, u);
        a3 = _mm512_fmadd_ps(a3, w, u); a4 = _mm512_fmadd_ps(a4, w, u); a5 = _mm512_fmadd_ps(a5, w, u);
        a6 = _mm512_fmadd_ps(a6, w, u); a7 = _mm512_fmadd_ps(a7, w, u); a8 = _mm512_fmadd_ps(a8, w, u);
        a9 = _mm512_fmadd_ps(a9, w, u);
        PIN(a0); PIN(a1); PIN(a2); PIN(a3); PIN(a4); PIN(a5); PIN(a6); PIN(a7); PIN(a8); PIN(a9);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    j->sink = _mm512_reduce_add_ps(_mm512_add_ps(s, _mm512_add_ps(a8, a9)));
    return 0;
}

// Best of three runs of `th` threads, seconds.
static double run(void *(*f)(void *), int th) {
    pthread_t t[256]; job_t j[256]; double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        for (int k = 0; k < th; k++) { j[k].seed = k; pthread_create(&t[k], 0, f, &j[k]); }
        for (int k = 0; k < th; k++) pthread_join(t[k], 0);
        double d = now() - t0; if (d < best) best = d;
    }
    return best;
}

int main(int argc, char **argv) {
    int max = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (max < 1 || max > 256) max = 1;
    printf("threads  vnni int8 TOPS  fp32 TFLOPS   (zmm, 10 independent chains)\n");
    for (int th = 1; th <= max; th = th < max && th * 2 > max ? max : th * 2) {
        double ops = (double)th * ITERS * 10;
        double v = ops * 64 * 2 / run(vnni, th) / 1e12;
        double f = ops * 16 * 2 / run(fma32, th) / 1e12;
        printf("%7d  %14.2f  %11.2f\n", th, v, f);
    }
    return 0;
}
