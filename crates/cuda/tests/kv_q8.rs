//! The q8_0 KV cache on the device (`KvElem::Q8_0`): the cache write gives the CPU
//! quantizer's bytes (`damascus_kernels::attn_kv::quantize_q8_0`: quants and f16 scales bit
//! for bit, ties and zero / subnormal-scale blocks included), RoPE on the way in matches a host
//! rotation within one quant step, and every attention kernel reading the cache — decode
//! split-K, the tensor-core flash and CUDA-core prompt kernels, their paged twins — matches a
//! host reference (f64 attention over the same bytes read back and widened,
//! `damascus_cuda::kv_layout::widen_head`) on awkward sizes: head sizes 32..256, GQA groups
//! 1..8, lengths 1, 3, 7, 33, 1023 and a depth past several splits; a batched pass over a
//! q8_0 pool gives a lone sequence's bits.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::{gpu, host_attention, randn};

use std::sync::Mutex;

use damascus_cuda::kv_layout::{kv_head_bytes, widen_head};
use damascus_cuda::{AttnParams, CudaError, DevKv, DevVec, Gpu, KvElem, PagedSeq};
use damascus_kernels::attn_kv::quantize_q8_0;

/// Tests here switch the flash path on and off on the one shared device: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// The CUDA-core kernels (f32 math over exactly widened values) against the f64 host.
const F32_TOL: f32 = 2e-4;
/// Flash (q, p and the widened cache rounded to f16) against the f64 host.
const FLASH_TOL: f32 = 4e-3;

/// Runs one pass of `n` rows at `pos0` through the private cache `kv` (layer `layer`):
/// writes k/v, attends, returns out `[n, n_head * hd]`.
#[allow(clippy::too_many_arguments)]
fn run_lone_pass(
    g: &Gpu,
    kv: &DevKv,
    layer: usize,
    pos0: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    rope: Option<(&DevVec, bool)>,
    params: AttnParams,
) -> Vec<f32> {
    let (n_head, n_kv, hd) = (kv.n_head, kv.n_kv, kv.head_dim);
    let n = q.len() / (n_head * hd);
    let qa = g.act(n, n_head * hd).unwrap();
    let ka = g.act(n, n_kv * hd).unwrap();
    let va = g.act(n, n_kv * hd).unwrap();
    let oa = g.act(n, n_head * hd).unwrap();
    g.write(&qa, q).unwrap();
    g.write(&ka, k).unwrap();
    g.write(&va, v).unwrap();
    g.begin(n, pos0).unwrap();
    g.rope_attention_with(kv, layer, pos0, &qa, &ka, &va, &oa, rope, params)
        .unwrap();
    g.end().unwrap();
    g.read(&oa).unwrap()
}

/// One layer of a q8_0 cache read back and widened: `[n_kv][n_ctx * hd]` keys and values.
fn widened(g: &Gpu, kv: &DevKv, layer: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let (kb, vb) = g.read_kv_layer(kv, layer).unwrap();
    let hb = kv_head_bytes(kv.elem, kv.n_ctx, kv.head_dim);
    let widen = |b: &[u8]| {
        (0..kv.n_kv)
            .map(|h| widen_head(kv.elem, &b[h * hb..(h + 1) * hb], kv.n_ctx, kv.head_dim))
            .collect::<Vec<_>>()
    };
    (widen(&kb), widen(&vb))
}

/// f64 attention of query row `q` `[n_head * hd]` at position `pos` over positions
/// `lo..=pos` of the widened cache, position `p` in slot `slot(p)`.
#[allow(clippy::too_many_arguments)]
fn host_attn(
    q: &[f32],
    kw: &[Vec<f32>],
    vw: &[Vec<f32>],
    n_head: usize,
    hd: usize,
    pos: usize,
    params: AttnParams,
    slot: &dyn Fn(usize) -> usize,
) -> Vec<f32> {
    host_attention(
        q,
        n_head,
        kw.len(),
        hd,
        pos,
        params,
        |kvh, p| &kw[kvh][slot(p) * hd..][..hd],
        |kvh, p| &vw[kvh][slot(p) * hd..][..hd],
    )
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol, "{what} [{i}]: {a} vs {b}");
    }
}

/// Key rows with the blocks a quantizer gets wrong first: all zeros (scale 0), ties at .5
/// with amax 127 (scale exactly 1: round half away from zero), huge values, a scale that
/// underflows f16 (stored 0 while the quants are not) and negative maxima.
fn awkward_rows(n_rows: usize, hd: usize, seed: u64) -> Vec<f32> {
    let mut x = randn(n_rows * hd, seed);
    for (r, row) in x.chunks_exact_mut(hd).enumerate() {
        let b = &mut row[..32];
        match r % 6 {
            0 => b.fill(0.0),
            1 => {
                for (j, v) in b.iter_mut().enumerate() {
                    *v = (j as f32 - 16.0) * 4.0 + 0.5;
                }
                b[31] = 127.0;
            }
            2 => b.iter_mut().for_each(|v| *v *= 3.0e4),
            3 => b.iter_mut().for_each(|v| *v *= 1.0e-6),
            4 => b[7] = -5.0,
            _ => {}
        }
    }
    x
}

#[test]
fn cache_write_bytes_equal_the_cpu_quantizer() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    g.set_flash(true);
    for (n_head, n_kv, hd) in [
        (4usize, 2usize, 32usize),
        (3, 1, 64),
        (8, 8, 96),
        (8, 2, 128),
        (2, 1, 256),
    ] {
        // Passes of 33 (prompt), 1 (decode) and 3 rows, written at their positions of layer 1
        // of a two-layer cache with room for 40.
        let n_ctx = 40;
        let total = 37;
        let kv = g.kv_of(KvElem::Q8_0, 2, n_ctx, n_kv, hd, n_head).unwrap();
        let k = awkward_rows(total * n_kv, hd, 7 + hd as u64);
        let v = awkward_rows(total * n_kv, hd, 9 + hd as u64);
        let q = randn(total * n_head * hd, 11);
        let mut pos = 0;
        for n in [33usize, 1, 3] {
            let (qw, kw) = (n_head * hd, n_kv * hd);
            run_lone_pass(
                &g,
                &kv,
                1,
                pos,
                &q[pos * qw..(pos + n) * qw],
                &k[pos * kw..(pos + n) * kw],
                &v[pos * kw..(pos + n) * kw],
                None,
                AttnParams::default(),
            );
            pos += n;
        }
        let (kb, vb) = g.read_kv_layer(&kv, 1).unwrap();
        let hb = kv_head_bytes(KvElem::Q8_0, n_ctx, hd);
        for (src, bytes, what) in [(&k, &kb, "keys"), (&v, &vb, "values")] {
            for p in 0..total {
                for h in 0..n_kv {
                    let row = &src[(p * n_kv + h) * hd..(p * n_kv + h + 1) * hd];
                    let mut qs = vec![0i8; hd];
                    let mut d = vec![0u16; hd / 32];
                    quantize_q8_0(row, &mut qs, &mut d).unwrap();
                    let region = &bytes[h * hb..(h + 1) * hb];
                    let got_q: Vec<i8> = region[p * hd..(p + 1) * hd]
                        .iter()
                        .map(|&b| b as i8)
                        .collect();
                    let s0 = n_ctx * hd + p * (hd / 32) * 2;
                    let got_d: Vec<u16> = region[s0..s0 + hd / 16]
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    assert_eq!(got_q, qs, "{what} quants: hd {hd} pos {p} kv head {h}");
                    assert_eq!(got_d, d, "{what} scales: hd {hd} pos {p} kv head {h}");
                }
            }
        }
        // Layer 0 was never written.
        let (k0, _) = g.read_kv_layer(&kv, 0).unwrap();
        assert!(k0.iter().all(|&b| b == 0));
    }
}

#[test]
fn rope_on_the_way_in_matches_a_host_rotation_within_a_quant_step() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (hd, half, neox) in [(64usize, 32usize, false), (128, 64, true), (128, 32, true)] {
        let (n_head, n_kv, n) = (4usize, 2usize, 9usize);
        let pos0 = 1000;
        let inv: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / (2 * half) as f32))
            .collect();
        let inv_dev = g.upload_f32(&inv).unwrap();
        let kv = g
            .kv_of(KvElem::Q8_0, 1, pos0 + n, n_kv, hd, n_head)
            .unwrap();
        let k = randn(n * n_kv * hd, 21);
        let v = randn(n * n_kv * hd, 22);
        let q = randn(n * n_head * hd, 23);
        run_lone_pass(
            &g,
            &kv,
            0,
            pos0,
            &q,
            &k,
            &v,
            Some((&inv_dev, neox)),
            AttnParams::default(),
        );
        let (kw, vw) = widened(&g, &kv, 0);
        for t in 0..n {
            let p = pos0 + t;
            for h in 0..n_kv {
                let src = &k[(t * n_kv + h) * hd..(t * n_kv + h + 1) * hd];
                let mut rot = src.to_vec();
                for (i, &f) in inv.iter().enumerate() {
                    let (a, b) = if neox {
                        (i, i + half)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let th = p as f64 * f64::from(f);
                    let (sn, cs) = (th.sin() as f32, th.cos() as f32);
                    rot[a] = src[a] * cs - src[b] * sn;
                    rot[b] = src[a] * sn + src[b] * cs;
                }
                let mut qs = vec![0i8; hd];
                let mut d = vec![0u16; hd / 32];
                quantize_q8_0(&rot, &mut qs, &mut d).unwrap();
                for e in 0..hd {
                    // One quant step (and an f16 ulp of the scale): the device may fuse the
                    // rotation's multiply-adds, moving a value across a rounding boundary.
                    let step = damascus_quant::fp::fp16_to_f32(d[e / 32]);
                    let want = f32::from(qs[e]) * step;
                    let got = kw[h][p * hd + e];
                    assert!(
                        (got - want).abs() <= step * 1.1 + 1e-6,
                        "hd {hd} neox {neox} pos {p} head {h} [{e}]: {got} vs {want}"
                    );
                    // Values are stored as they are.
                    let vsrc = v[(t * n_kv + h) * hd + e];
                    assert!((vw[h][p * hd + e] - vsrc).abs() <= 0.6 / 127.0);
                }
            }
        }
    }
}

#[test]
fn decode_and_prompt_attention_over_q8_match_host() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (n_head, n_kv, hd) in [
        (1usize, 1usize, 64usize),
        (8, 1, 128),
        (6, 2, 256),
        (4, 4, 32),
        (8, 4, 96),
        (7, 1, 64),
        (5, 1, 128),
        (6, 3, 64),
    ] {
        for len in [1usize, 3, 7, 33, 1023] {
            let params = AttnParams::default();
            let total = len + 1;
            let q = randn(total * n_head * hd, 31 + len as u64);
            let k = randn(total * n_kv * hd, 32 + len as u64);
            let v = randn(total * n_kv * hd, 33 + len as u64);
            let (qw, kw) = (n_head * hd, n_kv * hd);
            for flash in [true, false] {
                g.set_flash(flash);
                let kv = g
                    .kv_of(KvElem::Q8_0, 1, total + 2, n_kv, hd, n_head)
                    .unwrap();
                // A prompt of `len` rows (one row: the decode kernel), then a decode row.
                let prompt = run_lone_pass(
                    &g,
                    &kv,
                    0,
                    0,
                    &q[..len * qw],
                    &k[..len * kw],
                    &v[..len * kw],
                    None,
                    params,
                );
                let dec = run_lone_pass(
                    &g,
                    &kv,
                    0,
                    len,
                    &q[len * qw..],
                    &k[len * kw..],
                    &v[len * kw..],
                    None,
                    params,
                );
                let (kwid, vwid) = widened(&g, &kv, 0);
                let what = format!("heads {n_head}/{n_kv} hd {hd} len {len} flash {flash}");
                let tol = if flash && len > 1 { FLASH_TOL } else { F32_TOL };
                let rows: Vec<usize> = if len > 64 {
                    vec![0, 1, 31, 32, 63, 64, 500, len - 1]
                } else {
                    (0..len).collect()
                };
                for t in rows {
                    let want = host_attn(
                        &q[t * qw..(t + 1) * qw],
                        &kwid,
                        &vwid,
                        n_head,
                        hd,
                        t,
                        params,
                        &|p| p,
                    );
                    assert_close(&prompt[t * qw..(t + 1) * qw], &want, tol, &what);
                }
                let want = host_attn(
                    &q[len * qw..],
                    &kwid,
                    &vwid,
                    n_head,
                    hd,
                    len,
                    params,
                    &|p| p,
                );
                assert_close(&dec, &want, F32_TOL, &format!("{what} decode"));
            }
        }
    }
    g.set_flash(true);
}

#[test]
fn deep_decode_and_windows_over_q8_match_host() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    g.set_flash(true);
    // Depth 4100 takes 64-position splits, 9000 128; a window and a scale override.
    for (n_head, n_kv, hd, depth, window, scale) in [
        (8usize, 2usize, 128usize, 4100usize, 0usize, None),
        (4, 1, 64, 9000, 3000, Some(0.05f32)),
    ] {
        let params = AttnParams { scale, window };
        let total = depth + 2;
        let (qw, kw) = (n_head * hd, n_kv * hd);
        let q = randn(total * qw, 41);
        let k = randn(total * kw, 42);
        let v = randn(total * kw, 43);
        let kv = g.kv_of(KvElem::Q8_0, 1, total, n_kv, hd, n_head).unwrap();
        let prompt = run_lone_pass(
            &g,
            &kv,
            0,
            0,
            &q[..depth * qw],
            &k[..depth * kw],
            &v[..depth * kw],
            None,
            params,
        );
        let mut decs = Vec::new();
        for pos in depth..total {
            let r = pos * qw..(pos + 1) * qw;
            let rk = pos * kw..(pos + 1) * kw;
            decs.push(run_lone_pass(
                &g,
                &kv,
                0,
                pos,
                &q[r],
                &k[rk.clone()],
                &v[rk],
                None,
                params,
            ));
        }
        let (kwid, vwid) = widened(&g, &kv, 0);
        let what = format!("depth {depth} window {window}");
        for t in [0, 63, 64, 4095, depth - 1] {
            let want = host_attn(
                &q[t * qw..(t + 1) * qw],
                &kwid,
                &vwid,
                n_head,
                hd,
                t,
                params,
                &|p| p,
            );
            assert_close(&prompt[t * qw..(t + 1) * qw], &want, FLASH_TOL, &what);
        }
        for (i, got) in decs.iter().enumerate() {
            let pos = depth + i;
            let want = host_attn(
                &q[pos * qw..(pos + 1) * qw],
                &kwid,
                &vwid,
                n_head,
                hd,
                pos,
                params,
                &|p| p,
            );
            assert_close(got, &want, F32_TOL, &format!("{what} decode at {pos}"));
        }
    }
}

// ---------------------------------------------------------------------------------------
// A batched pass over a q8_0 pool.

/// Passes of three sequences: (sequence, rows) in batch order — prompt chunks with tile tails
/// and a chunk appended to cached positions, decode rows, a pass of one row.
const SCHEDULE: [&[(usize, usize)]; 4] = [
    &[(0, 37), (1, 5), (2, 1)],
    &[(0, 1), (1, 70), (2, 1)],
    &[(2, 1), (0, 1), (1, 3)],
    &[(1, 1)],
];

fn lengths() -> [usize; 3] {
    let mut len = [0; 3];
    for step in SCHEDULE {
        for &(s, n) in step {
            len[s] += n;
        }
    }
    len
}

#[test]
fn paged_q8_batches_match_host_and_lone_sequences_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (n_head, n_kv, hd, use_rope) in [
        (4usize, 2usize, 64usize, false),
        (8, 1, 128, true),
        (4, 2, 256, false),
        (3, 1, 96, false),
        (4, 2, 32, true),
    ] {
        let params = AttnParams::default();
        let (qw, kw) = (n_head * hd, n_kv * hd);
        let len = lengths();
        let data: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = len
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                let s = 100 + 7 * i as u64 + hd as u64;
                (randn(l * qw, s), randn(l * kw, s + 1), randn(l * kw, s + 2))
            })
            .collect();
        let inv: Vec<f32> = (0..hd / 2)
            .map(|i| 10000f32.powf(-((2 * i) as f32) / hd as f32))
            .collect();
        let inv_dev = g.upload_f32(&inv).unwrap();
        let rope = use_rope.then_some((&inv_dev, true));
        // Blocks of 5 slots (no power of two: every flash tile crosses blocks), handed out
        // in a scrambled order.
        let bs = 5;
        let n_blocks = len.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 2;
        let mut order: Vec<u32> = (0..n_blocks as u32).collect();
        let r = randn(n_blocks, 3);
        order.sort_by(|&a, &b| r[a as usize].total_cmp(&r[b as usize]));
        let mut it = order.into_iter();
        let tables: Vec<Vec<u32>> = len
            .iter()
            .map(|&l| it.by_ref().take(l.div_ceil(bs)).collect())
            .collect();
        for flash in [true, false] {
            g.set_flash(flash);
            let mut pool = g
                .kv_of(KvElem::Q8_0, 2, n_blocks * bs, n_kv, hd, n_head)
                .unwrap();
            let lone: Vec<DevKv> = len
                .iter()
                .map(|&l| g.kv_of(KvElem::Q8_0, 2, l, n_kv, hd, n_head).unwrap())
                .collect();
            let mut done = [0usize; 3];
            for (i, step) in SCHEDULE.iter().enumerate() {
                let n: usize = step.iter().map(|&(_, r)| r).sum();
                let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
                let mut seqs = Vec::new();
                let mut lone_out = Vec::new();
                let mut start = 0;
                for &(s, r) in step.iter() {
                    let (dq, dk, dv) = &data[s];
                    let (rq, rk) = (
                        done[s] * qw..(done[s] + r) * qw,
                        done[s] * kw..(done[s] + r) * kw,
                    );
                    q.extend_from_slice(&dq[rq.clone()]);
                    k.extend_from_slice(&dk[rk.clone()]);
                    v.extend_from_slice(&dv[rk.clone()]);
                    seqs.push(PagedSeq {
                        rows: start..start + r,
                        pos0: done[s],
                        table: &tables[s],
                    });
                    start += r;
                    lone_out.extend(run_lone_pass(
                        &g,
                        &lone[s],
                        1,
                        done[s],
                        &dq[rq],
                        &dk[rk.clone()],
                        &dv[rk],
                        rope,
                        params,
                    ));
                }
                let qa = g.act(n, qw).unwrap();
                let ka = g.act(n, kw).unwrap();
                let va = g.act(n, kw).unwrap();
                let oa = g.act(n, qw).unwrap();
                g.write(&qa, &q).unwrap();
                g.write(&ka, &k).unwrap();
                g.write(&va, &v).unwrap();
                g.begin(n, 0).unwrap();
                g.attention_paged(&mut pool, 1, bs, &seqs, &qa, &ka, &va, &oa, rope, params)
                    .unwrap();
                g.end().unwrap();
                let out = g.read(&oa).unwrap();
                let what = format!("heads {n_head}/{n_kv} hd {hd} flash {flash} pass {i}");
                let differ = out
                    .iter()
                    .zip(&lone_out)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(differ, 0, "{what}: paged vs lone bits");
                // The pool's bytes, widened, through each sequence's table: the host's answer.
                let (kwid, vwid) = widened(&g, &pool, 1);
                let mut row = 0;
                for &(s, r) in step.iter() {
                    let table = &tables[s];
                    let slot = |p: usize| table[p / bs] as usize * bs + p % bs;
                    let tol = if flash && r > 1 { FLASH_TOL } else { F32_TOL };
                    for t in 0..r {
                        let got = &out[(row + t) * qw..(row + t + 1) * qw];
                        if use_rope {
                            // q was rotated on the device: compare paged with lone only.
                            continue;
                        }
                        let p = done[s] + t;
                        let want = host_attn(
                            &data[s].0[p * qw..(p + 1) * qw],
                            &kwid,
                            &vwid,
                            n_head,
                            hd,
                            p,
                            params,
                            &slot,
                        );
                        assert_close(got, &want, tol, &format!("{what} seq {s} pos {p}"));
                    }
                    row += r;
                    done[s] += r;
                }
            }
        }
    }
    g.set_flash(true);
}

#[test]
fn q8_cache_refuses_head_sizes_off_its_blocks() {
    let Some(g) = gpu() else { return };
    let e = g.kv_of(KvElem::Q8_0, 1, 8, 1, 16, 1).err();
    assert!(
        matches!(e, Some(CudaError::Shape(ref m)) if m.contains("multiple of 32")),
        "{e:?}"
    );
}
