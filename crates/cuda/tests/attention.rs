//! The attention kernels against a host reference (f64 over f16-rounded keys and values) on
//! random inputs with tails: the tensor-core flash prompt kernel and the CUDA-core one (head
//! sizes 64, 128, 256; GQA groups 1..8; prompts not a multiple of the 64-row tile; a prompt
//! appended to a cache that already holds positions), sliding windows and a scale override,
//! and decode split over the KV length at depths where the split grows past 32 positions.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::{f16_round, gpu, host_attention, randn};

use std::sync::Mutex;

use damascus_cuda::{AttnParams, CudaError, DevKv, Gpu, decode_chunk};

/// Tests here switch the flash path on and off on the one shared device: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// One problem: heads, sizes and the random q/k/v of every position `0..total`.
struct Case {
    n_head: usize,
    n_kv: usize,
    hd: usize,
    q: Vec<f32>,  // [total, n_head, hd]
    k: Vec<f32>,  // [total, n_kv, hd]
    v: Vec<f32>,  // [total, n_kv, hd]
    kr: Vec<f32>, // k rounded to f16 (what the cache holds)
    vr: Vec<f32>,
    params: AttnParams,
}

impl Case {
    fn new(
        n_head: usize,
        n_kv: usize,
        hd: usize,
        total: usize,
        seed: u64,
        params: AttnParams,
    ) -> Self {
        let k = randn(total * n_kv * hd, seed + 2);
        let v = randn(total * n_kv * hd, seed + 3);
        Case {
            n_head,
            n_kv,
            hd,
            q: randn(total * n_head * hd, seed + 1),
            kr: f16_round(&k),
            vr: f16_round(&v),
            k,
            v,
            params,
        }
    }

    /// Host attention of the token at position `pos` (all heads, `[n_head * hd]`).
    fn host(&self, pos: usize) -> Vec<f32> {
        let (n_head, n_kv, hd) = (self.n_head, self.n_kv, self.hd);
        host_attention(
            &self.q[pos * n_head * hd..(pos + 1) * n_head * hd],
            n_head,
            n_kv,
            hd,
            pos,
            self.params,
            |kvh, p| &self.kr[(p * n_kv + kvh) * hd..][..hd],
            |kvh, p| &self.vr[(p * n_kv + kvh) * hd..][..hd],
        )
    }

    /// Runs tokens `pos0..pos0 + n` through the device (writing their k/v into `kv`).
    fn run(&self, g: &Gpu, kv: &DevKv, pos0: usize, n: usize) -> Vec<f32> {
        let (n_head, n_kv, hd) = (self.n_head, self.n_kv, self.hd);
        let qa = g.act(n, n_head * hd).unwrap();
        let ka = g.act(n, n_kv * hd).unwrap();
        let va = g.act(n, n_kv * hd).unwrap();
        let oa = g.act(n, n_head * hd).unwrap();
        g.write(&qa, &self.q[pos0 * n_head * hd..(pos0 + n) * n_head * hd])
            .unwrap();
        g.write(&ka, &self.k[pos0 * n_kv * hd..(pos0 + n) * n_kv * hd])
            .unwrap();
        g.write(&va, &self.v[pos0 * n_kv * hd..(pos0 + n) * n_kv * hd])
            .unwrap();
        g.begin(n, pos0).unwrap();
        g.rope_attention_with(kv, 0, pos0, &qa, &ka, &va, &oa, None, self.params)
            .unwrap();
        g.end().unwrap();
        g.read(&oa).unwrap()
    }

    /// Checks rows `rows` (token indices within a pass starting at `pos0`) of `got`.
    fn check(
        &self,
        got: &[f32],
        pos0: usize,
        rows: impl Iterator<Item = usize>,
        tol: f32,
        what: &str,
    ) {
        let w = self.n_head * self.hd;
        for t in rows {
            let want = self.host(pos0 + t);
            for (i, (&a, &b)) in got[t * w..(t + 1) * w].iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{what}: heads {}/{} hd {} {:?} pos {} [{i}]: {a} vs {b}",
                    self.n_head,
                    self.n_kv,
                    self.hd,
                    self.params,
                    pos0 + t
                );
            }
        }
    }
}

/// Flash (f16 q and p) against the f64 host.
const FLASH_TOL: f32 = 3e-3;
/// The CUDA-core kernels (f32 math) against the f64 host.
const F32_TOL: f32 = 2e-4;

#[test]
fn flash_prompt_matches_host_for_every_head_size_and_group() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (n_head, n_kv, hd) in [
        (3usize, 1usize, 64usize),
        (24, 8, 128),
        (8, 1, 128),
        (4, 4, 64),
        (4, 2, 256),
        (7, 7, 128),
        (4, 2, 16),
        (6, 2, 32),
        (8, 4, 96),
    ] {
        // A 77-token prompt (tile tail), then a 130-token chunk after it (a prompt appended to
        // a cache that already holds positions), then 3 more tokens.
        let total = 77 + 130 + 3;
        let c = Case::new(
            n_head,
            n_kv,
            hd,
            total,
            hd as u64 + n_head as u64,
            AttnParams::default(),
        );
        for flash in [true, false] {
            g.set_flash(flash);
            let tol = if flash { FLASH_TOL } else { F32_TOL };
            let kv = g.kv(1, total + 5, n_kv, hd, n_head).unwrap();
            let got = c.run(&g, &kv, 0, 77);
            c.check(&got, 0, 0..77, tol, "prompt");
            let got = c.run(&g, &kv, 77, 130);
            c.check(&got, 77, 0..130, tol, "appended chunk");
            let got = c.run(&g, &kv, 207, 3);
            c.check(&got, 207, 0..3, tol, "short chunk");
        }
    }
    g.set_flash(true);
}

#[test]
fn sliding_window_and_scale_override_match_host() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (n_head, n_kv, hd, window, scale) in [
        (4usize, 2usize, 64usize, 50usize, None),
        (8, 4, 128, 33, Some(0.0625f32)),
        (2, 1, 256, 100, Some(0.2)),
        (3, 3, 64, 1, None),
        (4, 1, 128, 0, Some(0.05)),
        (4, 2, 16, 16, None),
        (4, 2, 32, 8, None),
        (3, 1, 96, 20, None),
    ] {
        let params = AttnParams { scale, window };
        let total = 150 + 40;
        let c = Case::new(n_head, n_kv, hd, total, 7 + window as u64, params);
        for flash in [true, false] {
            g.set_flash(flash);
            let tol = if flash { FLASH_TOL } else { F32_TOL };
            let kv = g.kv(1, total, n_kv, hd, n_head).unwrap();
            let got = c.run(&g, &kv, 0, 150);
            c.check(&got, 0, 0..150, tol, "windowed prompt");
            for pos in 150..total {
                let got = c.run(&g, &kv, pos, 1);
                c.check(&got, pos, 0..1, F32_TOL, "windowed decode");
            }
        }
    }
    g.set_flash(true);
}

#[test]
fn decode_at_depth_matches_host() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    g.set_flash(true);
    // Depth 16500 takes 256-position splits, 9000 128 and 4100 64; a window at depth too.
    for (n_head, n_kv, hd, window) in [
        (4usize, 2usize, 128usize, 0usize),
        (2, 1, 64, 3000),
        (2, 1, 96, 0),
        (4, 2, 32, 0),
    ] {
        let depth = 16500;
        let total = depth + 8;
        let c = Case::new(
            n_head,
            n_kv,
            hd,
            total,
            99,
            AttnParams {
                scale: None,
                window,
            },
        );
        let kv = g.kv(1, total, n_kv, hd, n_head).unwrap();
        let got = c.run(&g, &kv, 0, depth);
        // The host reference is quadratic: check a few rows of the long prompt.
        c.check(
            &got,
            0,
            [0, 1, 63, 64, 4095, 4100, depth - 1].into_iter(),
            FLASH_TOL,
            "deep prompt",
        );
        for pos in depth..total {
            let got = c.run(&g, &kv, pos, 1);
            c.check(&got, pos, 0..1, F32_TOL, "deep decode");
        }
        assert_eq!(decode_chunk(depth + 1), 256);
        // And decodes at shallower depths (shorter splits) over the same cache prefix.
        for pos in [9000, 4100] {
            let got = c.run(&g, &kv, pos, 1);
            c.check(&got, pos, 0..1, F32_TOL, "decode at a shallower depth");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Batched passes over a shared paged pool (`Gpu::attention_paged`).

/// One pass of a paged schedule: (sequence, rows) in batch order.
type Step = &'static [(usize, usize)];

/// Ragged passes of four sequences: prompt chunks (tile tails, a chunk appended to cached
/// positions), one-row decode steps, a one-token prompt, sequences in any order, and a pass of
/// one row (the graph-shaped path).
const SCHEDULE: [Step; 5] = [
    &[(0, 37), (1, 5), (2, 1)],
    &[(0, 1), (1, 20), (2, 1), (3, 70)],
    &[(0, 1), (1, 1), (2, 1), (3, 1)],
    &[(2, 1), (0, 1), (3, 3)],
    &[(1, 1)],
];

/// Positions each sequence of [`SCHEDULE`] ends with.
fn schedule_lengths() -> [usize; 4] {
    let mut len = [0; 4];
    for step in SCHEDULE {
        for &(s, n) in step {
            len[s] += n;
        }
    }
    len
}

/// Block tables for sequences of `lengths` over a pool of `n_blocks` blocks of `bs`, the
/// blocks handed out in a scrambled order.
fn scrambled_tables(lengths: &[usize], bs: usize, n_blocks: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut free: Vec<u32> = (0..n_blocks as u32).collect();
    let r = randn(n_blocks, seed);
    free.sort_by(|&a, &b| r[a as usize].total_cmp(&r[b as usize]));
    let mut it = free.into_iter();
    lengths
        .iter()
        .map(|&l| it.by_ref().take(l.div_ceil(bs)).collect())
        .collect()
}

/// Rows `pos0..pos0 + n` of `x` `[total, width]`.
fn rows_of(x: &[f32], width: usize, pos0: usize, n: usize) -> &[f32] {
    &x[pos0 * width..(pos0 + n) * width]
}

/// Runs [`SCHEDULE`] through `attention_paged` (layer 1 of a two-layer pool of blocks of
/// `bs`) and returns every pass's output `[n, n_head * hd]`.
fn run_paged(
    g: &Gpu,
    cases: &[Case],
    bs: usize,
    rope: Option<(&damascus_cuda::DevVec, bool)>,
) -> Vec<Vec<f32>> {
    let (n_head, n_kv, hd) = (cases[0].n_head, cases[0].n_kv, cases[0].hd);
    let lengths = schedule_lengths();
    let n_blocks = lengths.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
    let tables = scrambled_tables(&lengths, bs, n_blocks, 5 + bs as u64);
    let mut kv = g.kv(2, n_blocks * bs, n_kv, hd, n_head).unwrap();
    let mut done = [0usize; 4];
    let mut outs = Vec::new();
    for step in SCHEDULE {
        let n: usize = step.iter().map(|&(_, r)| r).sum();
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let mut seqs = Vec::new();
        for &(s, r) in step.iter() {
            let c = &cases[s];
            q.extend_from_slice(rows_of(&c.q, n_head * hd, done[s], r));
            k.extend_from_slice(rows_of(&c.k, n_kv * hd, done[s], r));
            v.extend_from_slice(rows_of(&c.v, n_kv * hd, done[s], r));
            let start = seqs
                .last()
                .map_or(0, |p: &damascus_cuda::PagedSeq<'_>| p.rows.end);
            seqs.push(damascus_cuda::PagedSeq {
                rows: start..start + r,
                pos0: done[s],
                table: &tables[s],
            });
            done[s] += r;
        }
        let qa = g.act(n, n_head * hd).unwrap();
        let ka = g.act(n, n_kv * hd).unwrap();
        let va = g.act(n, n_kv * hd).unwrap();
        let oa = g.act(n, n_head * hd).unwrap();
        g.write(&qa, &q).unwrap();
        g.write(&ka, &k).unwrap();
        g.write(&va, &v).unwrap();
        g.begin(n, 0).unwrap();
        g.attention_paged(
            &mut kv,
            1,
            bs,
            &seqs,
            &qa,
            &ka,
            &va,
            &oa,
            rope,
            cases[0].params,
        )
        .unwrap();
        g.end().unwrap();
        outs.push(g.read(&oa).unwrap());
    }
    outs
}

/// Each sequence of [`SCHEDULE`] alone through the contiguous kernels (a private cache,
/// the same chunks): every pass's output rows, in [`run_paged`]'s order.
fn run_lone(
    g: &Gpu,
    cases: &[Case],
    rope: Option<(&damascus_cuda::DevVec, bool)>,
) -> Vec<Vec<f32>> {
    let (n_head, n_kv, hd) = (cases[0].n_head, cases[0].n_kv, cases[0].hd);
    let lengths = schedule_lengths();
    let kvs: Vec<DevKv> = lengths
        .iter()
        .map(|&l| g.kv(2, l + 1, n_kv, hd, n_head).unwrap())
        .collect();
    let mut done = [0usize; 4];
    let mut outs = Vec::new();
    for step in SCHEDULE {
        let mut out = Vec::new();
        for &(s, r) in step.iter() {
            let c = &cases[s];
            let qa = g.act(r, n_head * hd).unwrap();
            let ka = g.act(r, n_kv * hd).unwrap();
            let va = g.act(r, n_kv * hd).unwrap();
            let oa = g.act(r, n_head * hd).unwrap();
            g.write(&qa, rows_of(&c.q, n_head * hd, done[s], r))
                .unwrap();
            g.write(&ka, rows_of(&c.k, n_kv * hd, done[s], r)).unwrap();
            g.write(&va, rows_of(&c.v, n_kv * hd, done[s], r)).unwrap();
            g.begin(r, done[s]).unwrap();
            g.rope_attention_with(&kvs[s], 1, done[s], &qa, &ka, &va, &oa, rope, c.params)
                .unwrap();
            g.end().unwrap();
            out.extend(g.read(&oa).unwrap());
            done[s] += r;
        }
        outs.push(out);
    }
    outs
}

fn paged_cases(n_head: usize, n_kv: usize, hd: usize, params: AttnParams) -> Vec<Case> {
    schedule_lengths()
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            Case::new(
                n_head,
                n_kv,
                hd,
                l,
                1000 + 17 * i as u64 + hd as u64,
                params,
            )
        })
        .collect()
}

#[test]
fn paged_batches_match_host_and_lone_sequences_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for (n_head, n_kv, hd, window, scale) in [
        (4usize, 2usize, 64usize, 0usize, None),
        (8, 1, 128, 0, None),
        (4, 2, 256, 0, None),
        (6, 2, 128, 30, Some(0.07f32)),
        (4, 4, 64, 9, None),
        (3, 1, 96, 0, None),
        (4, 2, 32, 0, None),
    ] {
        let params = AttnParams { scale, window };
        let cases = paged_cases(n_head, n_kv, hd, params);
        for flash in [true, false] {
            g.set_flash(flash);
            let chunk_tol = if flash { FLASH_TOL } else { F32_TOL };
            // 16: the server's block size; 5: blocks that are no power of two and split
            // every flash tile.
            for bs in [16usize, 5] {
                let what = format!("paged flash={flash} bs={bs}");
                let paged = run_paged(&g, &cases, bs, None);
                let mut done = [0usize; 4];
                for (step, out) in SCHEDULE.iter().zip(&paged) {
                    let mut row = 0;
                    for &(s, r) in step.iter() {
                        let tol = if r == 1 { F32_TOL } else { chunk_tol };
                        let w = n_head * hd;
                        cases[s].check(&out[row * w..], done[s], 0..r, tol, &what);
                        row += r;
                        done[s] += r;
                    }
                }
                // The same rows alone over private caches: the same bits.
                let lone = run_lone(&g, &cases, None);
                for (i, (a, b)) in paged.iter().zip(&lone).enumerate() {
                    let differ = a
                        .iter()
                        .zip(b)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count();
                    assert_eq!(differ, 0, "{what} heads {n_head}/{n_kv} hd {hd}: pass {i}");
                }
            }
        }
    }
    g.set_flash(true);
}

#[test]
fn paged_rope_matches_lone_rope_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    g.set_flash(true);
    for (hd, half) in [(64usize, 32usize), (128, 16)] {
        let cases = paged_cases(4, 2, hd, AttnParams::default());
        let inv: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32))
            .collect();
        let inv = g.upload_f32(&inv).unwrap();
        for neox in [true, false] {
            let paged = run_paged(&g, &cases, 16, Some((&inv, neox)));
            let lone = run_lone(&g, &cases, Some((&inv, neox)));
            for (i, (a, b)) in paged.iter().zip(&lone).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "hd {hd} half {half} neox {neox}: pass {i}"
                );
            }
        }
    }
}

#[test]
fn paged_bad_batches_are_errors() {
    let Some(g) = gpu() else { return };
    let mut kv = g.kv(1, 32, 1, 64, 2).unwrap();
    let q = g.act(2, 128).unwrap();
    let k = g.act(2, 64).unwrap();
    let o = g.act(2, 128).unwrap();
    let p = AttnParams::default();
    let table = [1u32, 0];
    let seq = |rows, pos0, table| damascus_cuda::PagedSeq { rows, pos0, table };
    // A block past the pool, a table too short, rows left over, a layer past the cache.
    for (seqs, layer) in [
        (vec![seq(0..2, 0, &[2u32][..])], 0),
        (vec![seq(0..2, 15, &table[..1])], 0),
        (vec![seq(0..1, 0, &table[..])], 0),
        (vec![seq(0..2, 0, &table[..])], 1),
    ] {
        g.begin(2, 0).unwrap();
        let r = g.attention_paged(&mut kv, layer, 16, &seqs, &q, &k, &k, &o, None, p);
        g.end().unwrap();
        assert!(matches!(r, Err(CudaError::Shape(_))), "{r:?}");
    }
}

#[test]
fn copy_rows_gathers_rows_in_order() {
    let Some(g) = gpu() else { return };
    let src = randn(7 * 33, 4);
    let a = g.act(7, 33).unwrap();
    g.write(&a, &src).unwrap();
    for rows in [vec![6usize], vec![0, 1, 2], vec![5, 2, 3, 4, 0], vec![3, 3]] {
        let d = g.act(rows.len(), 33).unwrap();
        g.copy_rows(&a, &rows, &d).unwrap();
        let got = g.read(&d).unwrap();
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| src[r * 33..(r + 1) * 33].to_vec())
            .collect();
        assert_eq!(got, want, "rows {rows:?}");
    }
    let d = g.act(2, 33).unwrap();
    assert!(g.copy_rows(&a, &[7, 0], &d).is_err());
    assert!(g.copy_rows(&a, &[1], &d).is_err());
}

/// Prompts of three sequences, then `steps` decode-only passes of all three reusing one set of
/// activations (the second such pass on replays the captured graph when graphs are on): the
/// outputs of the decode passes.
fn paged_decode_steps(g: &Gpu, cases: &[Case], prompt: usize, steps: usize) -> Vec<Vec<f32>> {
    let (n_head, n_kv, hd) = (cases[0].n_head, cases[0].n_kv, cases[0].hd);
    let bs = 16;
    let lengths: Vec<usize> = cases.iter().map(|_| prompt + steps).collect();
    let n_blocks = lengths.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
    let tables = scrambled_tables(&lengths, bs, n_blocks, 77);
    let mut kv = g.kv(1, n_blocks * bs, n_kv, hd, n_head).unwrap();
    let pass = |rows: usize, pos0: usize, acts: &[damascus_cuda::DevAct], kv: &mut DevKv| {
        let n = rows * cases.len();
        let cat = |f: &dyn Fn(&Case) -> &[f32], w: usize| -> Vec<f32> {
            cases
                .iter()
                .flat_map(|c| rows_of(f(c), w, pos0, rows).to_vec())
                .collect()
        };
        g.write(&acts[0], &cat(&|c| &c.q, n_head * hd)).unwrap();
        g.write(&acts[1], &cat(&|c| &c.k, n_kv * hd)).unwrap();
        g.write(&acts[2], &cat(&|c| &c.v, n_kv * hd)).unwrap();
        let seqs: Vec<_> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| damascus_cuda::PagedSeq {
                rows: i * rows..(i + 1) * rows,
                pos0,
                table: t,
            })
            .collect();
        g.begin(n, 0).unwrap();
        g.attention_paged(
            kv,
            0,
            bs,
            &seqs,
            &acts[0],
            &acts[1],
            &acts[2],
            &acts[3],
            None,
            cases[0].params,
        )
        .unwrap();
        g.end().unwrap();
        g.read(&acts[3]).unwrap()
    };
    let acts = |n: usize| [n_head, n_kv, n_kv, n_head].map(|h| g.act(n, h * hd).unwrap());
    pass(prompt, 0, &acts(prompt * cases.len()), &mut kv);
    let dec = acts(cases.len());
    (0..steps)
        .map(|s| pass(1, prompt + s, &dec, &mut kv))
        .collect()
}

#[test]
fn paged_decode_graph_replays_match_eager_launches_and_host() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    g.set_flash(true);
    let cases: Vec<Case> = (0..3)
        .map(|i| Case::new(8, 2, 128, 45 + 6, 300 + i, AttnParams::default()))
        .collect();
    let graphed = paged_decode_steps(&g, &cases, 45, 6);
    g.set_graphs(false);
    let eager = paged_decode_steps(&g, &cases, 45, 6);
    g.set_graphs(true);
    let w = 8 * 128;
    for (s, (a, b)) in graphed.iter().zip(&eager).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "decode step {s}: graph replay differs from eager launches"
        );
        for (i, c) in cases.iter().enumerate() {
            c.check(&a[i * w..], 45 + s, 0..1, F32_TOL, "paged decode batch");
        }
    }
}
