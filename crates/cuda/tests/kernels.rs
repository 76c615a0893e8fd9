//! Every CUDA kernel against a host reference on random inputs with awkward sizes (1, 3, 7, 33
//! rows/tokens; K-quant rows of 1–3 super-blocks; positions across attention splits).
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::{f16_round, gpu, randn};

use damascus_cuda::layout::{self, Format};
use damascus_cuda::{CudaError, Gpu};
use damascus_gguf::GgmlType;

fn quantized(dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let x = randn(rows * cols, seed);
    let rb = dtype.row_bytes(cols as u64).unwrap() as usize;
    let mut out = vec![0u8; rows * rb];
    for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
        damascus_quant::quantize_row(dtype, &x[r * cols..(r + 1) * cols], dst).unwrap();
    }
    out
}

const TYPES: [GgmlType; 7] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_K, // through the f16 fallback
    GgmlType::F32,  // likewise
];

fn shapes(dtype: GgmlType) -> Vec<(usize, usize)> {
    if dtype.block_size() == 256 {
        vec![(1, 256), (3, 512), (7, 768), (33, 256)]
    } else {
        vec![(1, 32), (3, 96), (7, 256), (33, 800)]
    }
}

#[test]
fn dequant_matches_host_layout() {
    let Some(g) = gpu() else { return };
    for dtype in TYPES {
        for (rows, cols) in shapes(dtype) {
            let src = quantized(dtype, rows, cols, rows as u64 * 31 + cols as u64);
            let p = layout::pack(dtype, &src, rows, cols).unwrap();
            let m = g.upload_packed(&p).unwrap();
            let got = g.dequantize(&m).unwrap();
            for r in 0..rows {
                let want = layout::dequant_row(&p, r);
                for (c, (&a, &b)) in got[r * cols..(r + 1) * cols].iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                        "{dtype:?} [{rows},{cols}] ({r},{c}): gpu {a} host {b}"
                    );
                }
            }
        }
    }
}

/// The q8 rounding bound of `sum_i w_i x_i`: each x_i is off by at most half its block's step.
fn q8_bound(w: &[f32], x: &[f32]) -> f64 {
    let mut b = 0.0;
    for (wb, xb) in w.chunks(32).zip(x.chunks(32)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let step = f64::from(amax) / 127.0;
        b += wb.iter().map(|v| f64::from(v.abs())).sum::<f64>() * step * 0.51;
    }
    b
}

#[test]
fn gemv_and_gemm_match_host_dot_products() {
    let Some(g) = gpu() else { return };
    for dtype in TYPES {
        for (rows, cols) in shapes(dtype) {
            let src = quantized(dtype, rows, cols, 7 * rows as u64 + cols as u64);
            let p = layout::pack(dtype, &src, rows, cols).unwrap();
            let m = g.upload_packed(&p).unwrap();
            let w: Vec<Vec<f32>> = (0..rows).map(|r| layout::dequant_row(&p, r)).collect();
            // 1 and 3 tokens: the GEMVs; 16 and 33: the bf16 cuBLAS GEMM.
            for n in [1usize, 3, 16, 33] {
                let x = randn(n * cols, n as u64 + 99);
                let xa = g.act(n, cols).unwrap();
                let out = g.act(n, rows).unwrap();
                g.write(&xa, &x).unwrap();
                g.begin(n, 0).unwrap();
                g.matmul(&m, &xa, &out).unwrap();
                g.end().unwrap();
                let got = g.read(&out).unwrap();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for (r, wr) in w.iter().enumerate() {
                        let want: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| f64::from((a * b).abs()))
                            .sum();
                        let tol = if n >= damascus_cuda::GEMM_MIN_TOKENS {
                            // bf16 operands: 2^-8 relative each.
                            mag * 8e-3 + 1e-5
                        } else if p.format == Format::F16 {
                            mag * 2e-3 + 1e-5
                        } else {
                            q8_bound(wr, xt) + mag * 1e-5 + 1e-5
                        };
                        let gv = f64::from(got[t * rows + r]);
                        assert!(
                            (gv - want).abs() <= tol,
                            "{dtype:?} [{rows},{cols}] n={n} t={t} r={r}: gpu {gv} host {want} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batched_gemv_gives_each_token_its_one_token_bits() {
    // A decode batch of n < GEMM_MIN_TOKENS tokens runs `gemv_batch` (up to 8 tokens per
    // weight load; its twin is the one-token GEMV), or with it off the one-token GEMV with
    // blocks ordered (row block, token): either way every token must get the bits a pass of
    // its own gives (batch invariance), for one matrix and for a fused launch of three (row
    // counts 1, 7 and 33), on one-level and two-level activations.
    let Some(g) = gpu() else { return };
    for (dtype, batch_kernel, two_level) in TYPES
        .iter()
        .flat_map(|&d| [(true, false), (false, false), (true, true)].map(|(b, t)| (d, b, t)))
    {
        g.set_gemv_batch(batch_kernel);
        let cols = shapes(dtype)[1].1;
        let mats: Vec<_> = [1usize, 7, 33]
            .iter()
            .map(|&rows| {
                let src = quantized(dtype, rows, cols, 5 * rows as u64 + cols as u64);
                let mut m = g
                    .upload_packed(&layout::pack(dtype, &src, rows, cols).unwrap())
                    .unwrap();
                m.two_level = two_level;
                m
            })
            .collect();
        for n in [2usize, 7, 8, 9, 15] {
            let x = randn(n * cols, n as u64 + 7);
            let run = |x: &[f32], n: usize, fused: bool| -> Vec<Vec<f32>> {
                let xa = g.act(n, cols).unwrap();
                let outs: Vec<_> = mats.iter().map(|m| g.act(n, m.rows).unwrap()).collect();
                g.write(&xa, x).unwrap();
                g.begin(n, 0).unwrap();
                if fused {
                    let pairs: Vec<_> = mats.iter().zip(&outs).collect();
                    g.matmuls(&xa, &pairs, false).unwrap();
                } else {
                    g.matmul(&mats[2], &xa, &outs[2]).unwrap();
                }
                g.end().unwrap();
                outs.iter().map(|o| g.read(o).unwrap()).collect()
            };
            for fused in [false, true] {
                let batched = run(&x, n, fused);
                for t in 0..n {
                    let alone = run(&x[t * cols..(t + 1) * cols], 1, fused);
                    for (i, m) in mats.iter().enumerate() {
                        if !fused && i != 2 {
                            continue;
                        }
                        let got = &batched[i][t * m.rows..(t + 1) * m.rows];
                        assert!(
                            got.iter()
                                .zip(&alone[i])
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{dtype:?} cols {cols} n {n} token {t} matrix {i} fused {fused} \
                             batch kernel {batch_kernel} two-level {two_level}"
                        );
                    }
                }
            }
        }
    }
    g.set_gemv_batch(true);
}

#[test]
fn two_level_gemv_is_within_the_second_levels_rounding() {
    // Two-level q8 activations (the Q/K/V projections): x ≈ d₁q₁ + d₂q₂, so the dot is off by
    // the second level's rounding, about 1/254 of one level's (q8_bound), plus f32 sums.
    let Some(g) = gpu() else { return };
    for dtype in TYPES {
        for (rows, cols) in shapes(dtype) {
            let src = quantized(dtype, rows, cols, 5 * rows as u64 + cols as u64);
            let p = layout::pack(dtype, &src, rows, cols).unwrap();
            if p.format == Format::F16 {
                continue;
            }
            let mut m = g.upload_packed(&p).unwrap();
            m.two_level = true;
            let w: Vec<Vec<f32>> = (0..rows).map(|r| layout::dequant_row(&p, r)).collect();
            for n in [1usize, 3, 7] {
                let x = randn(n * cols, n as u64 + 41);
                let xa = g.act(n, cols).unwrap();
                let out = g.act(n, rows).unwrap();
                g.write(&xa, &x).unwrap();
                g.begin(n, 0).unwrap();
                g.matmul(&m, &xa, &out).unwrap();
                g.end().unwrap();
                let got = g.read(&out).unwrap();
                let want = host_matmul(&w, &x, n);
                for (i, (gv, &(v, q8_tol, mag))) in got.iter().zip(&want).enumerate() {
                    let tol = (q8_tol - mag * 1e-5 - 1e-5) / 64.0 + mag * 2e-5 + 1e-5;
                    assert!(
                        (f64::from(*gv) - v).abs() <= tol,
                        "{dtype:?} [{rows},{cols}] n={n} entry {i}: gpu {gv} host {v} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn norm_swiglu_add_rope_match_host() {
    let Some(g) = gpu() else { return };
    for (n, width) in [(1usize, 32usize), (3, 96), (7, 576), (33, 256)] {
        let x = randn(n * width, 5);
        let wv = randn(width, 6);
        let xa = g.act(n, width).unwrap();
        let oa = g.act(n, width).unwrap();
        g.write(&xa, &x).unwrap();
        let w = g.upload_f32(&wv).unwrap();
        g.begin(n, 0).unwrap();
        g.rms_norm(&xa, &w, 1e-5, &oa).unwrap();
        g.end().unwrap();
        let got = g.read(&oa).unwrap();
        for t in 0..n {
            let row = &x[t * width..(t + 1) * width];
            let ms: f64 = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / width as f64;
            let s = 1.0 / (ms + 1e-5).sqrt();
            for i in 0..width {
                let want = f64::from(row[i]) * s * f64::from(wv[i]);
                let gv = f64::from(got[t * width + i]);
                assert!(
                    (gv - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "rms_norm n={n} w={width} ({t},{i}): {gv} vs {want}"
                );
            }
        }

        // swiglu and add
        let up = randn(n * width, 8);
        let ua = g.act(n, width).unwrap();
        g.write(&ua, &up).unwrap();
        g.write(&oa, &x).unwrap();
        g.begin(n, 0).unwrap();
        g.swiglu(&oa, &ua).unwrap();
        g.add(&oa, &ua).unwrap();
        g.end().unwrap();
        let got = g.read(&oa).unwrap();
        for i in 0..n * width {
            let gt = f64::from(x[i]);
            let want = gt / (1.0 + (-gt).exp()) * f64::from(up[i]) + f64::from(up[i]);
            assert!(
                (f64::from(got[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "swiglu+add {i}"
            );
        }
    }
    // rope, both layouts, at a non-zero position
    for (n, n_head, hd, neox) in [
        (1usize, 3usize, 64usize, false),
        (7, 2, 128, true),
        (33, 1, 64, false),
    ] {
        let half = hd / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| 500000f32.powf(-2.0 * i as f32 / hd as f32))
            .collect();
        let x = randn(n * n_head * hd, 11);
        let xa = g.act(n, n_head * hd).unwrap();
        g.write(&xa, &x).unwrap();
        let iv = g.upload_f32(&inv).unwrap();
        let mut want = x.clone();
        let pos0 = 1234;
        for t in 0..n {
            for h in 0..n_head {
                let head = &mut want[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
                for (i, &f) in inv.iter().enumerate() {
                    let th = (pos0 + t) as f64 * f64::from(f);
                    let (s, c) = (th.sin() as f32, th.cos() as f32);
                    let (a, b) = if neox {
                        (i, i + half)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c - x1 * s;
                    head[b] = x0 * s + x1 * c;
                }
            }
        }
        g.begin(n, pos0).unwrap();
        g.rope(&xa, n_head, hd, &iv, neox).unwrap();
        g.end().unwrap();
        let got = g.read(&xa).unwrap();
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5,
                "rope n={n} hd={hd} neox={neox} {i}: {a} vs {b}"
            );
        }
    }
}

/// Host causal GQA attention over f16-rounded keys/values for all positions `0..n_pos`.
/// `q` [n_head, hd] of the token at position `n_pos - 1`.
fn host_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_pos: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
) -> Vec<f32> {
    let group = n_head / n_kv;
    let mut out = vec![0f32; n_head * hd];
    for h in 0..n_head {
        let kvh = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f64> = (0..n_pos)
            .map(|p| {
                let kr = &k[(p * n_kv + kvh) * hd..(p * n_kv + kvh + 1) * hd];
                qh.iter()
                    .zip(kr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum();
        for d in 0..hd {
            let acc: f64 = (0..n_pos)
                .map(|p| e[p] * f64::from(v[(p * n_kv + kvh) * hd + d]))
                .sum();
            out[h * hd + d] = (acc / l) as f32;
        }
    }
    out
}

#[test]
fn attention_decode_and_prefill_match_host() {
    let Some(g) = gpu() else { return };
    for (n_head, n_kv, hd) in [(3usize, 1usize, 64usize), (24, 8, 128), (4, 4, 64)] {
        let n_ctx = 200; // not a multiple of the 32-position split
        let kv = g.kv(2, n_ctx, n_kv, hd, n_head).unwrap();
        let layer = 1;
        // Fill with a prompt of 33 tokens (prefill kernel), then decode single tokens up to
        // position 150 (several splits), checking each step.
        let total = 151;
        let q_all = randn(total * n_head * hd, 21);
        let k_all = randn(total * n_kv * hd, 22);
        let v_all = randn(total * n_kv * hd, 23);
        let (kr, vr) = (f16_round(&k_all), f16_round(&v_all));
        let run = |pos0: usize, n: usize| -> Vec<f32> {
            let qa = g.act(n, n_head * hd).unwrap();
            let ka = g.act(n, n_kv * hd).unwrap();
            let va = g.act(n, n_kv * hd).unwrap();
            let oa = g.act(n, n_head * hd).unwrap();
            g.write(&qa, &q_all[pos0 * n_head * hd..(pos0 + n) * n_head * hd])
                .unwrap();
            g.write(&ka, &k_all[pos0 * n_kv * hd..(pos0 + n) * n_kv * hd])
                .unwrap();
            g.write(&va, &v_all[pos0 * n_kv * hd..(pos0 + n) * n_kv * hd])
                .unwrap();
            g.begin(n, pos0).unwrap();
            g.attention(&kv, layer, pos0, &qa, &ka, &va, &oa).unwrap();
            g.end().unwrap();
            g.read(&oa).unwrap()
        };
        let check = |got: &[f32], t_pos: usize, what: &str| {
            let q = &q_all[t_pos * n_head * hd..(t_pos + 1) * n_head * hd];
            let want = host_attention(q, &kr, &vr, t_pos + 1, n_head, n_kv, hd);
            // Prompts run the tensor-core kernel (q and p rounded to f16).
            let tol = if what == "decode" { 2e-4 } else { 3e-3 };
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{what} heads {n_head}/{n_kv} hd {hd} pos {t_pos} [{i}]: {a} vs {b}"
                );
            }
        };
        let got = run(0, 33);
        for t in 0..33 {
            check(&got[t * n_head * hd..(t + 1) * n_head * hd], t, "prefill");
        }
        let got = run(33, 7); // a second prompt chunk after cached positions
        for t in 0..7 {
            check(
                &got[t * n_head * hd..(t + 1) * n_head * hd],
                33 + t,
                "prefill chunk",
            );
        }
        for pos in 40..total {
            let got = run(pos, 1);
            if pos < 44 || pos % 17 == 0 || pos == total - 1 {
                check(&got, pos, "decode");
            }
        }
    }
}

#[test]
fn decode_graph_replays_match_eager_launches() {
    let Some(g) = gpu() else { return };
    // A small decode step (fused matmuls → rope+attention → matmul, matmul_add) at successive
    // positions: with
    // graphs on, the second and later steps replay the graph captured at the first.
    let cols = 256;
    let wq = quantized(GgmlType::Q4_K, 128, cols, 3);
    let wk = quantized(GgmlType::Q6_K, 64, cols, 4);
    let wo = quantized(GgmlType::Q8_0, 96, 128, 5);
    let mq = g.upload_matrix(GgmlType::Q4_K, &wq, 128, cols).unwrap();
    let mk = g.upload_matrix(GgmlType::Q6_K, &wk, 64, cols).unwrap();
    let mo = g.upload_matrix(GgmlType::Q8_0, &wo, 96, 128).unwrap();
    let inv = g.upload_f32(&[0.5f32, 0.1, 0.01, 0.001].repeat(8)).unwrap();
    let run = |graphs: bool| -> Vec<Vec<f32>> {
        g.set_graphs(graphs);
        let kv = g.kv(1, 100, 1, 64, 2).unwrap();
        let (x, q, k, a, o) = (
            g.act(1, cols).unwrap(),
            g.act(1, 128).unwrap(),
            g.act(1, 64).unwrap(),
            g.act(1, 128).unwrap(),
            g.act(1, 96).unwrap(),
        );
        (0..70)
            .map(|pos| {
                g.write(&x, &randn(cols, pos as u64 + 1)).unwrap();
                g.begin(1, pos).unwrap();
                g.matmuls(&x, &[(&mq, &q), (&mk, &k)], false).unwrap();
                g.rope_attention(&kv, 0, pos, &q, &k, &k, &a, Some((&inv, false)))
                    .unwrap();
                g.matmul(&mo, &a, &o).unwrap();
                g.matmul_add(&mo, &a, &o).unwrap();
                g.end().unwrap();
                g.read(&o).unwrap()
            })
            .collect()
    };
    let eager = run(false);
    let graphed = run(true);
    g.set_graphs(true);
    assert_eq!(eager, graphed, "graph replay differs from eager launches");
}

#[test]
fn fused_matmuls_match_separate_ones() {
    let Some(g) = gpu() else { return };
    // Q4_K, Q4_K, Q6_K: the first two share a GEMV launch, the third gets its own.
    let cols = 512;
    let shapes = [
        (GgmlType::Q4_K, 128),
        (GgmlType::Q4_K, 33),
        (GgmlType::Q6_K, 7),
    ];
    let mats: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(t, rows))| {
            let src = quantized(t, rows, cols, 40 + i as u64);
            g.upload_matrix(t, &src, rows, cols).unwrap()
        })
        .collect();
    for n in [1usize, 3, 16] {
        let xa = g.act(n, cols).unwrap();
        g.write(&xa, &randn(n * cols, 77)).unwrap();
        let single: Vec<Vec<f32>> = mats
            .iter()
            .map(|m| {
                let out = g.act(n, m.rows).unwrap();
                g.begin(n, 0).unwrap();
                g.matmul(m, &xa, &out).unwrap();
                g.end().unwrap();
                g.read(&out).unwrap()
            })
            .collect();
        let outs: Vec<_> = mats.iter().map(|m| g.act(n, m.rows).unwrap()).collect();
        let prior: Vec<Vec<f32>> = mats
            .iter()
            .enumerate()
            .map(|(i, m)| randn(n * m.rows, 90 + i as u64))
            .collect();
        for (o, p) in outs.iter().zip(&prior) {
            g.write(o, p).unwrap();
        }
        let pairs: Vec<_> = mats.iter().zip(&outs).collect();
        g.begin(n, 0).unwrap();
        g.matmuls(&xa, &pairs, true).unwrap();
        g.end().unwrap();
        for (i, o) in outs.iter().enumerate() {
            let got = g.read(o).unwrap();
            for (j, &v) in got.iter().enumerate() {
                let want = prior[i][j] + single[i][j];
                assert!(
                    (v - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "n={n} matrix {i} [{j}]: fused {v} vs {want}"
                );
            }
        }
    }
}

#[test]
fn fused_rope_attention_matches_rope_then_attention() {
    let Some(g) = gpu() else { return };
    // Full and partial rotary (16 of 64 dims), both pairings, prompt then decode.
    for (n_head, n_kv, hd, half, neox) in [
        (4usize, 2usize, 64usize, 32usize, false),
        (3, 1, 128, 64, true),
        (2, 2, 64, 8, true),
        (2, 1, 64, 8, false),
    ] {
        let inv: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / (2 * half) as f32))
            .collect();
        let iv = g.upload_f32(&inv).unwrap();
        let kv_a = g.kv(1, 64, n_kv, hd, n_head).unwrap();
        let kv_b = g.kv(1, 64, n_kv, hd, n_head).unwrap();
        for (pos0, n) in [(0usize, 20usize), (20, 1), (21, 1), (22, 3)] {
            let q = randn(n * n_head * hd, pos0 as u64 + 1);
            let k = randn(n * n_kv * hd, pos0 as u64 + 2);
            let v = randn(n * n_kv * hd, pos0 as u64 + 3);
            let run = |fused: bool| -> (Vec<f32>, Vec<f32>) {
                let kv = if fused { &kv_a } else { &kv_b };
                let (qa, ka, va) = (
                    g.act(n, n_head * hd).unwrap(),
                    g.act(n, n_kv * hd).unwrap(),
                    g.act(n, n_kv * hd).unwrap(),
                );
                let oa = g.act(n, n_head * hd).unwrap();
                g.write(&qa, &q).unwrap();
                g.write(&ka, &k).unwrap();
                g.write(&va, &v).unwrap();
                g.begin(n, pos0).unwrap();
                if fused {
                    g.rope_attention(kv, 0, pos0, &qa, &ka, &va, &oa, Some((&iv, neox)))
                        .unwrap();
                } else {
                    g.rope(&qa, n_head, hd, &iv, neox).unwrap();
                    g.rope(&ka, n_kv, hd, &iv, neox).unwrap();
                    g.attention(kv, 0, pos0, &qa, &ka, &va, &oa).unwrap();
                }
                g.end().unwrap();
                (g.read(&oa).unwrap(), g.read(&qa).unwrap())
            };
            let (fo, fq) = run(true);
            let (uo, uq) = run(false);
            assert_eq!(
                fq, uq,
                "rotated q, heads {n_head}/{n_kv} hd {hd} half {half}"
            );
            for (i, (&a, &b)) in fo.iter().zip(&uo).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6,
                    "heads {n_head}/{n_kv} hd {hd} half {half} neox {neox} pos {pos0}+{n} [{i}]: {a} vs {b}"
                );
            }
        }
    }
}

/// The host greedy pick the sampler makes: NaN never wins, `+inf` as `f32::MAX`, ties to the
/// lowest index.
fn host_argmax(row: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0usize);
    for (i, &v) in row.iter().enumerate() {
        let v = if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v.min(f32::MAX)
        };
        if v > best.0 {
            best = (v, i);
        }
    }
    best.1 as u32
}

#[test]
fn argmax_matches_host_pick_with_ties_nans_and_infinities() {
    let Some(g) = gpu() else { return };
    for (n, width) in [
        (1usize, 1usize),
        (1, 3),
        (3, 33),
        (2, 1023),
        (7, 1025),
        (1, 128_256),
    ] {
        let mut x = randn(n * width, (n * 31 + width) as u64);
        // Awkward rows: a tie between two positions, NaNs around the maximum, all -inf,
        // +inf twice, all NaN.
        for (r, row) in x.chunks_exact_mut(width).enumerate() {
            match r % 6 {
                1 if width > 2 => {
                    row[width - 1] = 5.0;
                    row[width / 2] = 5.0;
                }
                2 => {
                    row.iter_mut().step_by(2).for_each(|v| *v = f32::NAN);
                }
                3 => row.fill(f32::NEG_INFINITY),
                4 if width > 1 => {
                    row[width - 1] = f32::INFINITY;
                    row[1] = f32::INFINITY;
                }
                5 => row.fill(f32::NAN),
                _ => {}
            }
        }
        let a = g.act(n, width).unwrap();
        g.write(&a, &x).unwrap();
        let got = g.argmax(&a).unwrap();
        let want: Vec<u32> = x.chunks_exact(width).map(host_argmax).collect();
        assert_eq!(got, want, "[{n}, {width}]");
    }
}

/// `x · Wᵀ` in f64 from the host dequantization, per entry `(value, q8 tolerance, sum |w x|)`:
/// the tolerance covers the q8 rounding of x (the MMQ kernels read the same q8 shadow as the
/// GEMVs) and f32 accumulation.
fn host_matmul(w: &[Vec<f32>], x: &[f32], n: usize) -> Vec<(f64, f64, f64)> {
    let cols = x.len() / n;
    let mut out = Vec::with_capacity(n * w.len());
    for xt in x.chunks_exact(cols) {
        for wr in w {
            let (dot, mag) = wr.iter().zip(xt).fold((0.0, 0.0), |(d, m), (&a, &b)| {
                let p = f64::from(a) * f64::from(b);
                (d + p, m + p.abs())
            });
            out.push((dot, q8_bound(wr, xt) + mag * 1e-5 + 1e-5, mag));
        }
    }
    out
}

#[test]
fn mmq_matches_host_dot_products() {
    let Some(g) = gpu() else { return };
    // Rows: half a 64-row tile, one and a half, three. Tokens: tails of the 64-token tile on
    // either side. Columns: one and three K-quant super-blocks; 800 ends the 32-block formats
    // in a partial 256-column stage.
    for dtype in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
    ] {
        let col_set: &[usize] = if dtype.block_size() == 256 {
            &[256, 768]
        } else {
            &[256, 800]
        };
        for &cols in col_set {
            for rows in [32usize, 96, 192] {
                let src = quantized(dtype, rows, cols, 13 * rows as u64 + cols as u64);
                let p = layout::pack(dtype, &src, rows, cols).unwrap();
                let m = g.upload_packed(&p).unwrap();
                let w: Vec<Vec<f32>> = (0..rows).map(|r| layout::dequant_row(&p, r)).collect();
                for n in [1usize, 3, 7, 33, 100, 130] {
                    let x = randn(n * cols, 3 * n as u64 + cols as u64);
                    let want = host_matmul(&w, &x, n);
                    let xa = g.act(n, cols).unwrap();
                    let out = g.act(n, rows).unwrap();
                    g.write(&xa, &x).unwrap();
                    g.begin(n, 0).unwrap();
                    g.matmul_mmq(&m, &xa, &out, false).unwrap();
                    g.end().unwrap();
                    let got = g.read(&out).unwrap();
                    // acc = true adds into what out holds.
                    let base = randn(n * rows, 77 + n as u64);
                    g.write(&out, &base).unwrap();
                    g.begin(n, 0).unwrap();
                    g.matmul_mmq(&m, &xa, &out, true).unwrap();
                    g.end().unwrap();
                    let got_acc = g.read(&out).unwrap();
                    for (i, &(wv, tol, _)) in want.iter().enumerate() {
                        let (t, r) = (i / rows, i % rows);
                        let gv = f64::from(got[i]);
                        assert!(
                            (gv - wv).abs() <= tol,
                            "{dtype:?} [{rows},{cols}] n={n} t={t} r={r}: mmq {gv} host {wv} (tol {tol})"
                        );
                        let ga = f64::from(got_acc[i]);
                        let wa = wv + f64::from(base[i]);
                        assert!(
                            (ga - wa).abs() <= tol + 1e-6 * wa.abs(),
                            "{dtype:?} [{rows},{cols}] n={n} t={t} r={r} acc: mmq {ga} host {wa}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn mmq_rejects_what_it_cannot_take() {
    let Some(g) = gpu() else { return };
    let x = g.act(3, 256).unwrap();
    // f16 fallback weights: no MMQ kernel.
    let f = g
        .upload_matrix(GgmlType::F32, &vec![0u8; 32 * 256 * 4], 32, 256)
        .unwrap();
    let out = g.act(3, 32).unwrap();
    assert!(matches!(
        g.matmul_mmq(&f, &x, &out, false),
        Err(CudaError::Shape(_))
    ));
    // Rows not a multiple of 32.
    let q = quantized(GgmlType::Q8_0, 33, 256, 1);
    let m = g.upload_matrix(GgmlType::Q8_0, &q, 33, 256).unwrap();
    let out = g.act(3, 33).unwrap();
    assert!(matches!(
        g.matmul_mmq(&m, &x, &out, false),
        Err(CudaError::Shape(_))
    ));
}

#[test]
fn mmq_switch_routes_prompt_matmuls() {
    // A device of its own: the switch is per `Gpu`, and the other tests' prompt matmuls must
    // stay on cuBLAS while this one runs.
    if gpu().is_none() {
        return;
    }
    let g = Gpu::open(0).unwrap();
    g.set_mmq(true);
    // One fused call with the residual add: Q4_K [64, _] goes through MMQ; the f16 fallback
    // (Q5_K) and Q4_K with 48 rows (not a multiple of 32) through cuBLAS.
    let (n, cols) = (33usize, 512usize);
    let specs = [
        (GgmlType::Q4_K, 64usize, true),
        (GgmlType::Q5_K, 32, false),
        (GgmlType::Q4_K, 48, false),
    ];
    let mats: Vec<_> = specs
        .iter()
        .enumerate()
        .map(|(i, &(t, rows, _))| {
            let src = quantized(t, rows, cols, 90 + i as u64);
            let p = layout::pack(t, &src, rows, cols).unwrap();
            let w: Vec<Vec<f32>> = (0..rows).map(|r| layout::dequant_row(&p, r)).collect();
            (g.upload_packed(&p).unwrap(), w, p.bytes.len())
        })
        .collect();
    let x = randn(n * cols, 5);
    let xa = g.act(n, cols).unwrap();
    g.write(&xa, &x).unwrap();
    let outs: Vec<_> = mats
        .iter()
        .map(|(m, ..)| g.act(n, m.rows).unwrap())
        .collect();
    let bases: Vec<Vec<f32>> = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let b = randn(n * o.width, 60 + i as u64);
            g.write(o, &b).unwrap();
            b
        })
        .collect();
    let pairs: Vec<_> = mats.iter().zip(&outs).map(|((m, ..), o)| (m, o)).collect();
    g.begin(n, 0).unwrap();
    g.matmuls(&xa, &pairs, true).unwrap();
    g.end().unwrap();
    for (((m, w, packed), o), (base, &(_, _, mmq))) in
        mats.iter().zip(&outs).zip(bases.iter().zip(&specs))
    {
        // cuBLAS made (and kept) a bf16 copy of its weights; MMQ did not.
        assert_eq!(
            m.device_bytes() == *packed,
            mmq,
            "{:?} [{}, {cols}]: {} device bytes for {packed} packed",
            m.format,
            m.rows,
            m.device_bytes()
        );
        let got = g.read(o).unwrap();
        for (j, (&gv, &(wv, q8_tol, mag))) in got.iter().zip(&host_matmul(w, &x, n)).enumerate() {
            let wv = wv + f64::from(base[j]);
            // cuBLAS multiplies bf16 operands: 2^-8 relative each.
            let tol = if mmq { q8_tol } else { mag * 8e-3 + 1e-5 };
            assert!(
                (f64::from(gv) - wv).abs() <= tol + 1e-6 * wv.abs(),
                "{:?} [{}, {cols}] j={j}: gpu {gv} host {wv} (tol {tol})",
                m.format,
                m.rows
            );
        }
    }
}
