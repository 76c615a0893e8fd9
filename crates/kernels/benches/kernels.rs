//! Criterion benchmarks of the matrix micro-kernels, throughput in GOPS: criterion's
//! `elem/s` here counts operations (2 · rows · k · tokens per GEMM, 2 · rows · k per GEMV), so
//! `Gelem/s` reads as GOP/s (GFLOP/s for the f32/bf16 paths).
//!
//! Every path this CPU has is measured, single-threaded, on one Llama-3.2-3B-like slice (256
//! rows × 3072 columns; 64 tokens for the GEMMs) so a run stays short:
//! * `gemm/<path>/<type>`: the prefill GEMMs ([`gemm::gemm`]: f32 / bf16-panel / AMX paths;
//!   [`int8::gemm_i8`]: `vnni-int8`, `avx2-int8`);
//! * `gemv/<isa>/<type>`: the decode dot products ([`gemv_with`]) per ISA level;
//! * `gemm/packed-<path>/<type>` and `gemv/packed-<path>/<type>`: the same on weights repacked
//!   at load ([`PackedMatrix::gemm`], [`PackedMatrix::gemv_panels`]), per int8 path, and
//!   `gemm/packed-amx/<type>` ([`PackedMatrix::gemm_amx`]) on AMX CPUs.
//!
//! `cargo bench -p damascus-kernels --bench kernels [-- FILTER]`. The table-printing
//! harnesses `gemm` and `gemv` (no criterion) measure full-size shapes and thread counts.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;

use damascus_kernels::gemm::packed::PackedMatrix;
use damascus_kernels::gemm::{self, GemmPath, PackedActs, WeightRef, int8};
use damascus_kernels::quantdot::{ActBuf, Isa, WeightType, gemv_with, kernels_for};
use damascus_quant::GgmlType;

mod common;
use common::{acts, quantized_weights, tame_scales};

const ROWS: usize = 256;
const K: usize = 3072;
const TOKENS: usize = 64;
/// The weight types measured.
const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
];

/// `[ROWS, K]` `dt` blocks as the GEMMs take them.
fn weights(dt: GgmlType, bytes: &[u8]) -> WeightRef<'_> {
    WeightRef {
        dtype: dt,
        bytes,
        rows: ROWS,
        cols: K,
    }
}

fn bench_gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements((2 * ROWS * K * TOKENS) as u64));
    let x = acts(TOKENS * K);
    for dt in TYPES {
        let bytes = quantized_weights(dt, ROWS, K);
        let w = weights(dt, &bytes);
        let mut out = vec![0f32; TOKENS * ROWS];
        for path in GemmPath::available() {
            if path == GemmPath::Scalar || w.unsupported().is_some() {
                continue;
            }
            let xp = PackedActs::for_path(path, &x, TOKENS, K, None).expect("pack");
            g.bench_function(BenchmarkId::new(path.name(), format!("{dt:?}")), |b| {
                b.iter(|| gemm::gemm(path, w, black_box(&xp), &mut out, None).expect("gemm"))
            });
            if path == GemmPath::Amx && PackedMatrix::unsupported(&w).is_none() {
                let pk = PackedMatrix::pack(w, None).expect("pack");
                let id = BenchmarkId::new("packed-amx", format!("{dt:?}"));
                g.bench_function(id, |b| {
                    b.iter(|| pk.gemm_amx(black_box(&xp), &mut out, None).expect("gemm"))
                });
            }
        }
        for ip in int8::Int8Path::available() {
            if ip == int8::Int8Path::Scalar || !ip.supports(dt) || int8::unsupported(&w).is_some() {
                continue;
            }
            let xq = int8::QActs::new(&x, TOKENS, K, None).expect("quantize x");
            g.bench_function(BenchmarkId::new(ip.name(), format!("{dt:?}")), |b| {
                b.iter(|| int8::gemm_i8(ip, w, black_box(&xq), &mut out, None).expect("gemm"))
            });
            let pk = PackedMatrix::pack(w, None).expect("pack");
            let id = BenchmarkId::new(format!("packed-{}", ip.name()), format!("{dt:?}"));
            g.bench_function(id, |b| {
                b.iter(|| pk.gemm(ip, black_box(&xq), &mut out, None).expect("gemm"))
            });
        }
    }
    g.finish();
}

fn bench_packed_gemv(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemv");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements((2 * ROWS * K) as u64));
    let x = acts(K);
    let xq = int8::QActs::new(&x, 1, K, None).expect("quantize x");
    for dt in TYPES {
        let bytes = quantized_weights(dt, ROWS, K);
        let w = weights(dt, &bytes);
        let pk = PackedMatrix::pack(w, None).expect("pack");
        let mut out = vec![0f32; ROWS];
        for ip in int8::Int8Path::available() {
            if !ip.supports(dt) {
                continue;
            }
            let id = BenchmarkId::new(format!("packed-{}", ip.name()), format!("{dt:?}"));
            g.bench_function(id, |b| {
                b.iter(|| {
                    pk.gemv_panels(ip, black_box(&xq), 0..ROWS / int8::ROWS, &mut out, ROWS)
                        .expect("gemv")
                })
            });
        }
    }
    g.finish();
}

fn bench_gemv(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemv");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements((2 * ROWS * K) as u64));
    let x = acts(K);
    for wt in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q4_0,
    ] {
        let Some(rb) = wt.row_bytes(K) else {
            continue;
        };
        // Random blocks with small finite f16 scales, as the `gemv` bench.
        let mut w: Vec<u8> = (0..ROWS * rb)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        tame_scales(wt, &mut w);
        let mut a = ActBuf::new(wt.act_type());
        a.quantize(&x).expect("quantize x");
        let mut out = vec![0f32; ROWS];
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni] {
            let Some(kern) = kernels_for(isa) else {
                continue;
            };
            g.bench_function(BenchmarkId::new(isa.name(), wt.name()), |b| {
                b.iter(|| {
                    gemv_with(kern, wt, &w, black_box(a.as_acts()), &mut out, None).expect("gemv")
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_gemm, bench_gemv, bench_packed_gemv);
criterion_main!(benches);
