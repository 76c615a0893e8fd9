//! Activations reused across row counts and the row limits of the matmul paths (issue 26):
//! an activation resized in place ([`Gpu::set_rows`]) gives the bits of a fresh one of that
//! size on every path; decode batches up to [`Gpu::set_gemv_rows`] rows stay on the GEMVs with
//! each row's one-row bits; [`Gpu::set_mmq_rows`] sends passes up to that size to MMQ (no bf16
//! weight copy), longer ones to cuBLAS; a decode batch on cuBLAS replayed as a graph gives the
//! eager launches' results.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::{own_gpu, randn};

use damascus_cuda::layout;
use damascus_cuda::{AttnParams, DevAct, DevMatrix, Gpu, PagedSeq};
use damascus_gguf::GgmlType;

/// A `[rows, cols]` matrix of `dtype` on the device and its packed size in bytes.
fn matrix(
    g: &Gpu,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    two_level: bool,
) -> (DevMatrix, usize) {
    let x = randn(rows * cols, 17 * rows as u64 + cols as u64);
    let rb = dtype.row_bytes(cols as u64).unwrap() as usize;
    let mut src = vec![0u8; rows * rb];
    for (r, dst) in src.chunks_exact_mut(rb).enumerate() {
        damascus_quant::quantize_row(dtype, &x[r * cols..(r + 1) * cols], dst).unwrap();
    }
    let p = layout::pack(dtype, &src, rows, cols).unwrap();
    let mut m = g.upload_packed(&p).unwrap();
    m.two_level = two_level;
    (m, p.bytes.len())
}

/// `x · Wᵀ` for `x` `[n, cols]` through `xa`/`out` (already `[n, _]`).
fn run(g: &Gpu, m: &DevMatrix, x: &[f32], xa: &DevAct, out: &DevAct) -> Vec<f32> {
    g.write(xa, x).unwrap();
    g.begin(xa.n, 0).unwrap();
    g.matmul(m, xa, out).unwrap();
    g.end().unwrap();
    g.read(out).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn resized_activations_give_the_bits_of_fresh_ones() {
    let Some(g) = own_gpu() else { return };
    for (dtype, cols) in [
        (GgmlType::Q4_K, 512usize),
        (GgmlType::Q6_K, 256),
        (GgmlType::Q8_0, 800),
        (GgmlType::Q5_K, 256), // the f16 fallback
    ] {
        for two_level in [false, true] {
            let (m, _) = matrix(&g, dtype, 96, cols, two_level);
            let cap = 40;
            let mut xa = g.act(cap, cols).unwrap();
            let mut out = g.act(cap, m.rows).unwrap();
            // Shrinking and growing again within the capacity; 1..15 on the GEMVs (two-level
            // where asked), 16.. on cuBLAS.
            for n in [1usize, 3, 8, 15, 33, 2, 40, 16] {
                assert!(g.set_rows(&mut xa, n) && g.set_rows(&mut out, n));
                assert_eq!((xa.n, out.n), (n, n));
                let x = randn(n * cols, n as u64 + 3);
                let got = run(&g, &m, &x, &xa, &out);
                let want = run(
                    &g,
                    &m,
                    &x,
                    &g.act(n, cols).unwrap(),
                    &g.act(n, m.rows).unwrap(),
                );
                assert!(
                    same_bits(&got, &want),
                    "{dtype:?} cols {cols} two-level {two_level}: {n} rows in a {cap}-row act"
                );
            }
            assert!(!g.set_rows(&mut xa, cap + 1), "past the capacity");
            assert_eq!(xa.n, 16, "a refused resize leaves the act as it was");
        }
    }
}

#[test]
fn gemv_rows_keeps_decode_batches_up_to_64_on_their_one_row_bits() {
    let Some(g) = own_gpu() else { return };
    g.set_gemv_rows(64);
    for (dtype, cols) in [(GgmlType::Q4_K, 512usize), (GgmlType::Q6_K, 256)] {
        for two_level in [false, true] {
            let (m, packed) = matrix(&g, dtype, 33, cols, two_level);
            for n in [16usize, 17, 33, 64] {
                let x = randn(n * cols, n as u64 + 11);
                let batched = run(
                    &g,
                    &m,
                    &x,
                    &g.act(n, cols).unwrap(),
                    &g.act(n, m.rows).unwrap(),
                );
                for t in 0..n {
                    let alone = run(
                        &g,
                        &m,
                        &x[t * cols..(t + 1) * cols],
                        &g.act(1, cols).unwrap(),
                        &g.act(1, m.rows).unwrap(),
                    );
                    assert!(
                        same_bits(&batched[t * m.rows..(t + 1) * m.rows], &alone),
                        "{dtype:?} two-level {two_level}: row {t} of {n}"
                    );
                }
            }
            assert_eq!(
                m.device_bytes(),
                packed,
                "{dtype:?}: no bf16 copy on the GEMVs"
            );
        }
    }
    // 65 rows: the prompt GEMM (cuBLAS, which makes the bf16 copy).
    let (m, packed) = matrix(&g, GgmlType::Q4_K, 64, 256, false);
    let x = randn(65 * 256, 5);
    run(
        &g,
        &m,
        &x,
        &g.act(65, 256).unwrap(),
        &g.act(65, 64).unwrap(),
    );
    assert!(m.device_bytes() > packed);
}

#[test]
fn mmq_rows_sends_short_passes_to_mmq_and_long_ones_to_cublas() {
    let Some(g) = own_gpu() else { return };
    g.set_mmq_rows(64);
    let cols = 512;
    for n in [16usize, 33, 64, 65] {
        let (m, packed) = matrix(&g, GgmlType::Q4_K, 64, cols, false);
        let x = randn(n * cols, n as u64);
        let got = run(&g, &m, &x, &g.act(n, cols).unwrap(), &g.act(n, 64).unwrap());
        if n <= 64 {
            assert_eq!(m.device_bytes(), packed, "{n} rows: MMQ, no bf16 copy");
            // The same kernel as an explicit MMQ matmul: the same bits.
            let (xa, out) = (g.act(n, cols).unwrap(), g.act(n, 64).unwrap());
            g.write(&xa, &x).unwrap();
            g.begin(n, 0).unwrap();
            g.matmul_mmq(&m, &xa, &out, false).unwrap();
            g.end().unwrap();
            assert!(same_bits(&got, &g.read(&out).unwrap()), "{n} rows");
        } else {
            assert!(m.device_bytes() > packed, "{n} rows: cuBLAS on a bf16 copy");
        }
    }
}

#[test]
fn decode_batch_graphs_on_cublas_match_eager_launches() {
    let Some(g) = own_gpu() else { return };
    // 20 decode rows (one per sequence, each in its own block of a shared pool): past the
    // GEMV rows, so the matmuls run on cuBLAS; with graphs on, the second and later steps
    // replay the graph captured at the first.
    let (n, cols, hd, bs) = (20usize, 256usize, 64usize, 16usize);
    let (m_q, _) = matrix(&g, GgmlType::Q4_K, 2 * hd, cols, true);
    let (m_k, _) = matrix(&g, GgmlType::Q6_K, hd, cols, true);
    let (m_v, _) = matrix(&g, GgmlType::Q8_0, hd, cols, true);
    let (m_o, _) = matrix(&g, GgmlType::Q8_0, cols, 2 * hd, false);
    let inv = g.upload_f32(&[0.5f32, 0.1, 0.01, 0.001].repeat(8)).unwrap();
    let tables: Vec<Vec<u32>> = (0..n as u32)
        .map(|i| vec![(7 * i + 3) % n as u32])
        .collect();
    let run = |graphs: bool| -> Vec<Vec<f32>> {
        g.set_graphs(graphs);
        let mut kv = g.kv(1, n * bs, 1, hd, 2).unwrap();
        let x = g.act(n, cols).unwrap();
        let (q, k, v) = (
            g.act(n, 2 * hd).unwrap(),
            g.act(n, hd).unwrap(),
            g.act(n, hd).unwrap(),
        );
        let (a, o) = (g.act(n, 2 * hd).unwrap(), g.act(n, cols).unwrap());
        (0..12)
            .map(|pos| {
                let seqs: Vec<PagedSeq<'_>> = tables
                    .iter()
                    .enumerate()
                    .map(|(i, t)| PagedSeq {
                        rows: i..i + 1,
                        pos0: pos,
                        table: t,
                    })
                    .collect();
                g.write(&x, &randn(n * cols, pos as u64 + 1)).unwrap();
                g.write(&o, &randn(n * cols, pos as u64 + 100)).unwrap();
                g.begin(n, 0).unwrap();
                g.matmuls(&x, &[(&m_q, &q), (&m_k, &k), (&m_v, &v)], false)
                    .unwrap();
                let params = AttnParams {
                    scale: None,
                    window: 0,
                };
                g.attention_paged(
                    &mut kv,
                    0,
                    bs,
                    &seqs,
                    &q,
                    &k,
                    &v,
                    &a,
                    Some((&inv, false)),
                    params,
                )
                .unwrap();
                g.matmul_add(&m_o, &a, &o).unwrap();
                g.end().unwrap();
                g.read(&o).unwrap()
            })
            .collect()
    };
    let eager = run(false);
    let graphed = run(true);
    assert!(
        g.gemm_graphs(),
        "capturing cuBLAS failed: decode batches on it run eager"
    );
    assert_eq!(eager, graphed, "graph replay differs from eager launches");
}
