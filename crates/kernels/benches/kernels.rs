//! Criterion benchmarks of the matrix micro-kernels, throughput in GOPS: criterion's
//! `elem/s` here counts operations (2 · rows · k · tokens per GEMM, 2 · rows · k per GEMV), so
//! `Gelem/s` reads as GOP/s (GFLOP/s for the f32/bf16 paths).
//!
//! Every path this CPU has is measured, single-threaded, on one Llama-3.2-3B-like slice (256
//! rows × 3072 columns; 64 tokens for the GEMMs) so a run stays short:
//! * `gemm/<path>/<type>`: the prefill GEMMs ([`gemm::gemm`]: f32 / bf16-panel / AMX paths;
//!   [`int8::gemm_i8`]: `vnni-int8`, `avx2-int8`);
//! * `gemv/<isa>/<type>`: the decode dot products ([`gemv_with`]) per ISA level.
//!
//! `cargo bench -p damascus-kernels --bench kernels [-- FILTER]`. The table-printing
//! harnesses `gemm` and `gemv` (no criterion) measure full-size shapes and thread counts.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;

use damascus_kernels::gemm::{self, GemmPath, PackedActs, WeightRef, int8};
use damascus_kernels::quantdot::{ActBuf, Isa, WeightType, gemv_with, kernels_for};
use damascus_quant::{GgmlType, quantize_row};

const ROWS: usize = 256;
const K: usize = 3072;
const TOKENS: usize = 64;

/// `rows × k` weights of `dt`, quantized from a fixed pseudo-random pattern.
fn weights(dt: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let rb = k / dt.block_size() * dt.type_size();
    let src: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut bytes = vec![0u8; rows * rb];
    for r in 0..rows {
        quantize_row(
            dt,
            &src[r * k..(r + 1) * k],
            &mut bytes[r * rb..(r + 1) * rb],
        )
        .expect("quantize");
    }
    bytes
}

fn acts(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 104_729 % 997) as f32 / 498.0) - 1.0)
        .collect()
}

fn bench_gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements((2 * ROWS * K * TOKENS) as u64));
    let x = acts(TOKENS * K);
    for dt in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
    ] {
        let bytes = weights(dt, ROWS, K);
        let w = WeightRef {
            dtype: dt,
            bytes: &bytes,
            rows: ROWS,
            cols: K,
        };
        let mut out = vec![0f32; TOKENS * ROWS];
        for path in GemmPath::available() {
            if path == GemmPath::Scalar || w.unsupported().is_some() {
                continue;
            }
            let xp = PackedActs::for_path(path, &x, TOKENS, K, None).expect("pack");
            g.bench_function(BenchmarkId::new(path.name(), format!("{dt:?}")), |b| {
                b.iter(|| gemm::gemm(path, w, black_box(&xp), &mut out, None).expect("gemm"))
            });
        }
        for ip in int8::Int8Path::available() {
            if ip == int8::Int8Path::Scalar || !ip.supports(dt) || int8::unsupported(&w).is_some() {
                continue;
            }
            let xq = int8::QActs::new(&x, TOKENS, K, None).expect("quantize x");
            g.bench_function(BenchmarkId::new(ip.name(), format!("{dt:?}")), |b| {
                b.iter(|| int8::gemm_i8(ip, w, black_box(&xq), &mut out, None).expect("gemm"))
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
        // Random blocks with small finite f16 scales (0x2000 ≈ 0.0078), as the `gemv` bench.
        let mut w: Vec<u8> = (0..ROWS * rb)
            .map(|i| ((i * 2_654_435_761) >> 13) as u8)
            .collect();
        let scale_offs: &[usize] = match wt {
            WeightType::Q6_K => &[208],
            WeightType::Q4_1 | WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
            _ => &[0],
        };
        for b in w.chunks_exact_mut(wt.block_bytes()) {
            for &off in scale_offs {
                b[off..off + 2].copy_from_slice(&0x2000u16.to_le_bytes());
            }
        }
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

criterion_group!(benches, bench_gemm, bench_gemv);
criterion_main!(benches);
