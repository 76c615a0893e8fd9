//! Programmatic dependent launch (`Gpu::set_pdl`, `DAMASCUS_CUDA_PDL`) changes when kernels
//! start, never what they compute, and the decode fusions (`Gpu::set_fuse`,
//! `DAMASCUS_CUDA_FUSE`: RMSNorm + second q8 level, gate/up GEMV + SwiGLU/GeGLU) only how many
//! launches compute it: a decode chain (every GEMV format, three matrices per launch, row
//! counts that leave partial blocks, the two-level q8 path, RMSNorm, fused RoPE + attention
//! across splits, SwiGLU, residual adds, the device argmax) gives the same bits with PDL on
//! (with and without the GEMV weight prefetch) and with the fusions as with both off, launched
//! eagerly and replayed from graphs; passes of 3 and 9 tokens (the batched GEMV) likewise; the
//! fused activations (both kinds, 1 to 65 chunks of 32 rows) give the activation kernels'
//! bits, q8 shadow included.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure. On a device of
//! compute capability 9.0 or more, PDL must actually turn on.
#![cfg(feature = "cuda")]

mod common;

use common::{gpu, randn};

use std::sync::Mutex;

use damascus_cuda::{DevMatrix, Gpu};
use damascus_gguf::GgmlType;

/// The tests switch device-wide settings (PDL, graphs): one at a time.
static SETTINGS: Mutex<()> = Mutex::new(());

fn matrix(g: &Gpu, dtype: GgmlType, rows: usize, cols: usize, seed: u64) -> DevMatrix {
    let x = randn(rows * cols, seed);
    let rb = dtype.row_bytes(cols as u64).unwrap() as usize;
    let mut bytes = vec![0u8; rows * rb];
    for (r, dst) in bytes.chunks_exact_mut(rb).enumerate() {
        damascus_quant::quantize_row(dtype, &x[r * cols..(r + 1) * cols], dst).unwrap();
    }
    g.upload_matrix(dtype, &bytes, rows, cols).unwrap()
}

/// (PDL, weight prefetch, graphs, fusions) of each run; the first is the plain launches
/// everything else must match.
const MODES: [(bool, bool, bool, bool); 8] = [
    (false, false, false, false),
    (false, false, true, false),
    (true, true, false, false),
    (true, true, true, false),
    (true, false, true, false),
    (false, false, false, true),
    (false, false, true, true),
    (true, true, true, true),
];

#[test]
fn pdl_is_on_where_the_device_has_it() {
    let Some(g) = gpu() else { return };
    let _guard = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    g.set_pdl(true, true);
    let on = g.pdl();
    g.set_pdl(false, false);
    assert!(!g.pdl());
    eprintln!(
        "{} (sm_{}{}): PDL {}",
        g.name,
        g.compute_capability.0,
        g.compute_capability.1,
        if on { "on" } else { "unavailable" }
    );
    assert_eq!(on, g.compute_capability.0 >= 9, "PDL availability");
}

#[test]
fn decode_chain_gives_the_same_bits_with_pdl_and_fusions() {
    let Some(g) = gpu() else { return };
    let _guard = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    // A small decoder layer: hidden 512, 4 query heads and 2 KV heads of 64 (Q 256, K/V 128),
    // FFN 1024, then two heads of 33 and 7 rows (partial last GEMV blocks; Q5_K through the
    // f16 fallback).
    let (hidden, n_head, n_kv, hd, ffn) = (512usize, 4usize, 2usize, 64usize, 1024usize);
    let mut wq = matrix(&g, GgmlType::Q4_K, n_head * hd, hidden, 1);
    wq.two_level = true;
    let wk = matrix(&g, GgmlType::Q4_K, n_kv * hd, hidden, 2);
    let wv = matrix(&g, GgmlType::Q4_K, n_kv * hd, hidden, 3);
    let wo = matrix(&g, GgmlType::Q6_K, hidden, n_head * hd, 4);
    let wg = matrix(&g, GgmlType::Q8_0, ffn, hidden, 5);
    let wu = matrix(&g, GgmlType::Q8_0, ffn, hidden, 6);
    let wd = matrix(&g, GgmlType::Q5_0, hidden, ffn, 7);
    let w1 = matrix(&g, GgmlType::Q4_1, 33, hidden, 8);
    let wf = matrix(&g, GgmlType::Q5_K, 7, hidden, 9); // f16 fallback
    let norm = g.upload_f32(&randn(hidden, 10)).unwrap();
    let inv = g
        .upload_f32(
            &(0..hd / 2)
                .map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let run = |pdl: bool, prefetch: bool, graphs: bool, fuse: bool| -> Vec<Vec<f32>> {
        g.set_pdl(pdl, prefetch);
        g.set_graphs(graphs);
        g.set_fuse(fuse);
        let kv = g.kv(1, 300, n_kv, hd, n_head).unwrap();
        let x = g.act(1, hidden).unwrap();
        let h = g.act(1, hidden).unwrap();
        let (q, k, v, a) = (
            g.act(1, n_head * hd).unwrap(),
            g.act(1, n_kv * hd).unwrap(),
            g.act(1, n_kv * hd).unwrap(),
            g.act(1, n_head * hd).unwrap(),
        );
        let (gate, up) = (g.act(1, ffn).unwrap(), g.act(1, ffn).unwrap());
        let (o1, of) = (g.act(1, 33).unwrap(), g.act(1, 7).unwrap());
        let mut outs = Vec::new();
        // Past 256 positions: attention takes several splits.
        for pos in 0..270 {
            g.write(&x, &randn(hidden, pos as u64 + 100)).unwrap();
            g.begin(1, pos).unwrap();
            g.rms_norm(&x, &norm, 1e-5, &h).unwrap();
            g.matmuls(&h, &[(&wq, &q), (&wk, &k), (&wv, &v)], false)
                .unwrap();
            // RMSNorm, GEMV; without the fusion a second-level quantization between them.
            assert_eq!(g.pending_ops(), if fuse { 2 } else { 3 }, "fuse {fuse}");
            g.rope_attention(&kv, 0, pos, &q, &k, &v, &a, Some((&inv, false)))
                .unwrap();
            g.matmul_add(&wo, &a, &x).unwrap();
            g.rms_norm(&x, &norm, 1e-5, &h).unwrap();
            let before = g.pending_ops();
            g.matmuls(&h, &[(&wg, &gate), (&wu, &up)], false).unwrap();
            g.swiglu(&gate, &up).unwrap();
            // The gate/up GEMV; without the fusion a SwiGLU after it.
            let ops = g.pending_ops() - before;
            assert_eq!(ops, if fuse { 1 } else { 2 }, "fuse {fuse}");
            g.matmul_add(&wd, &gate, &x).unwrap();
            g.matmuls(&x, &[(&w1, &o1), (&wf, &of)], false).unwrap();
            g.end().unwrap();
            if pos % 9 == 0 || pos >= 250 {
                outs.push(g.read(&x).unwrap());
                outs.push(g.read(&o1).unwrap());
                outs.push(g.read(&of).unwrap());
                let pick = g.argmax(&o1).unwrap();
                outs.push(pick.iter().map(|&i| i as f32).collect());
            }
        }
        outs
    };
    let mut base = None;
    for (pdl, prefetch, graphs, fuse) in MODES {
        let got = run(pdl, prefetch, graphs, fuse);
        if pdl && g.compute_capability.0 >= 9 {
            assert!(
                g.pdl(),
                "PDL was turned off: the driver refused it (see stderr)"
            );
        }
        if graphs {
            // The graphs of this mode (and of earlier ones still cached: counts only add).
            let (all, programmatic) = g.graph_edges().unwrap();
            eprintln!("PDL {pdl}, fusions {fuse}: graph edges {all}, programmatic {programmatic}");
            if pdl && g.compute_capability.0 >= 9 {
                assert!(programmatic > 0, "capture dropped the programmatic edges");
            }
        }
        match &base {
            None => base = Some(got),
            Some(want) => assert!(
                *want == got,
                "PDL {pdl}, prefetch {prefetch}, graphs {graphs}, fusions {fuse}: bits differ \
                 from plain launches"
            ),
        }
    }
    g.set_pdl(false, false);
    g.set_graphs(true);
    g.set_fuse(false);
}

#[test]
fn batched_gemv_passes_give_the_same_bits_with_pdl_and_fusions() {
    let Some(g) = gpu() else { return };
    let _guard = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    // 3 and 9 tokens through `gemv_batch` (eager: not a one-token pass).
    let mats: Vec<DevMatrix> = [
        (GgmlType::Q4_K, 3, 256),
        (GgmlType::Q6_K, 1023, 512),
        (GgmlType::Q8_0, 7, 96),
        (GgmlType::Q5_0, 33, 800),
        (GgmlType::Q4_1, 1, 32),
        (GgmlType::Q5_K, 9, 256),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(t, r, c))| matrix(&g, t, r, c, 50 + i as u64))
    .collect();
    let mut wq = matrix(&g, GgmlType::Q4_K, 33, 512, 60);
    wq.two_level = true;
    let norm = g.upload_f32(&randn(512, 61)).unwrap();
    let run = |pdl: bool, prefetch: bool, fuse: bool| -> Vec<Vec<f32>> {
        g.set_pdl(pdl, prefetch);
        g.set_fuse(fuse);
        let mut outs = Vec::new();
        for n in [3usize, 9] {
            // RMSNorm into a two-level GEMV (the fusion's case), then every format.
            let (x, h, y) = (
                g.act(n, 512).unwrap(),
                g.act(n, 512).unwrap(),
                g.act(n, 33).unwrap(),
            );
            g.write(&x, &randn(n * 512, 62)).unwrap();
            g.begin(n, 5).unwrap();
            g.rms_norm(&x, &norm, 1e-6, &h).unwrap();
            g.matmul(&wq, &h, &y).unwrap();
            g.end().unwrap();
            outs.push(g.read(&y).unwrap());
            for (i, m) in mats.iter().enumerate() {
                let x = g.act(n, m.cols).unwrap();
                let y = g.act(n, m.rows).unwrap();
                g.write(&x, &randn(n * m.cols, 70 + i as u64)).unwrap();
                g.write(&y, &randn(n * m.rows, 80 + i as u64)).unwrap();
                g.begin(n, 5).unwrap();
                g.matmul(m, &x, &y).unwrap();
                g.matmul_add(m, &x, &y).unwrap();
                g.end().unwrap();
                outs.push(g.read(&y).unwrap());
            }
        }
        outs
    };
    let plain = run(false, false, false);
    let sm90 = g.compute_capability.0 >= 9;
    assert!(
        run(true, true, false) == plain && (g.pdl() || !sm90),
        "PDL stayed on"
    );
    assert!(plain == run(true, true, false), "PDL with prefetch");
    assert!(plain == run(true, false, false), "PDL without prefetch");
    assert!(plain == run(false, false, true), "fusions");
    assert!(plain == run(true, true, true), "PDL and fusions");
    g.set_pdl(false, false);
    g.set_fuse(false);
}

#[test]
fn fused_activations_give_the_activation_kernels_bits() {
    let Some(g) = gpu() else { return };
    let _guard = SETTINGS.lock().unwrap_or_else(|p| p.into_inner());
    for rows in [32usize, 96, 2080] {
        let wg = matrix(&g, GgmlType::Q4_K, rows, 256, rows as u64);
        let wu = matrix(&g, GgmlType::Q4_K, rows, 256, rows as u64 + 1);
        let wd = matrix(&g, GgmlType::Q8_0, 33, rows, rows as u64 + 2);
        for geglu in [false, true] {
            let run = |fuse: bool, graphs: bool| -> Vec<Vec<f32>> {
                g.set_fuse(fuse);
                g.set_graphs(graphs);
                let x = g.act(1, 256).unwrap();
                let (gate, up, y) = (
                    g.act(1, rows).unwrap(),
                    g.act(1, rows).unwrap(),
                    g.act(1, 33).unwrap(),
                );
                (0..3u64)
                    .flat_map(|step| {
                        g.write(&x, &randn(256, step + 7 * rows as u64)).unwrap();
                        g.begin(1, step as usize).unwrap();
                        g.matmuls(&x, &[(&wg, &gate), (&wu, &up)], false).unwrap();
                        if geglu {
                            g.geglu(&gate, &up).unwrap();
                        } else {
                            g.swiglu(&gate, &up).unwrap();
                        }
                        // Reads gate's q8 shadow.
                        g.matmul(&wd, &gate, &y).unwrap();
                        g.end().unwrap();
                        [g.read(&gate).unwrap(), g.read(&y).unwrap()]
                    })
                    .collect()
            };
            let plain = run(false, false);
            for graphs in [false, true] {
                assert!(
                    plain == run(true, graphs),
                    "rows {rows}, geglu {geglu}, graphs {graphs}: fused bits differ"
                );
            }
        }
    }
    g.set_fuse(false);
    g.set_graphs(true);
}
