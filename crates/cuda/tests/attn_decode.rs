//! The streamed decode attention (`kernels/attn_decode.cu`, `Gpu::set_attn_v2`) against its
//! twins: the host reference (f64 over the f16-rounded cache) and the split kernel
//! (`attn_split`, the setting off), on depths 1, 3, 7, 33, 1023, 4097, 9000 and 16500 (tile
//! and split tails, splits of 32, 64, 128 and 256 positions), head sizes 64/128/256, GQA groups 1/3/4/8, sliding
//! windows, private caches and the shared paged pool (blocks of 16 and 5: rows of one tile in
//! several blocks); a paged row gives the bits it gets alone, and a graph replay the bits of
//! eager launches.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes,
//! unless `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::{f16_round, gpu, host_attention, randn};

use std::sync::Mutex;

use damascus_cuda::{AttnParams, DevAct, DevKv, Gpu, PagedSeq};

/// Tests here switch the decode kernel and graphs on and off on the one shared device.
static LOCK: Mutex<()> = Mutex::new(());

/// The streamed kernel against the f64 host (f32 math over up to 16500 positions).
const HOST_TOL: f32 = 2e-4;
/// The streamed kernel against the split kernel (both f32; outputs are averages of values in
/// [-1, 1], so this is relative to their scale).
const TWIN_TOL: f32 = 1e-5;

/// Decode depths (positions the query sees, itself included).
const DEPTHS: [usize; 8] = [1, 3, 7, 33, 1023, 4097, 9000, 16500];

/// Heads, sizes and the random q/k/v of positions `0..total` of one sequence.
struct Seq {
    n_head: usize,
    n_kv: usize,
    hd: usize,
    q: Vec<f32>,  // [total, n_head, hd]
    k: Vec<f32>,  // [total, n_kv, hd]
    v: Vec<f32>,  // [total, n_kv, hd]
    kr: Vec<f32>, // k rounded to f16 (what the cache holds)
    vr: Vec<f32>,
}

impl Seq {
    fn new(n_head: usize, n_kv: usize, hd: usize, total: usize, seed: u64) -> Seq {
        let k = randn(total * n_kv * hd, seed + 2);
        let v = randn(total * n_kv * hd, seed + 3);
        Seq {
            n_head,
            n_kv,
            hd,
            q: randn(total * n_head * hd, seed + 1),
            kr: f16_round(&k),
            vr: f16_round(&v),
            k,
            v,
        }
    }

    fn rows<'a>(&self, x: &'a [f32], heads: usize, pos0: usize, n: usize) -> &'a [f32] {
        let w = heads * self.hd;
        &x[pos0 * w..(pos0 + n) * w]
    }

    /// Host attention of the query at `pos` (all heads, `[n_head * hd]`).
    fn host(&self, pos: usize, params: AttnParams) -> Vec<f32> {
        let (n_head, n_kv, hd) = (self.n_head, self.n_kv, self.hd);
        host_attention(
            &self.q[pos * n_head * hd..(pos + 1) * n_head * hd],
            n_head,
            n_kv,
            hd,
            pos,
            params,
            |kvh, p| &self.kr[(p * n_kv + kvh) * hd..][..hd],
            |kvh, p| &self.vr[(p * n_kv + kvh) * hd..][..hd],
        )
    }
}

/// Device activations of one pass of `n` rows: q, k, v, out.
struct Acts([DevAct; 4]);

impl Acts {
    fn new(g: &Gpu, s: &Seq, n: usize) -> Acts {
        let (h, kv, hd) = (s.n_head, s.n_kv, s.hd);
        Acts([h, kv, kv, h].map(|w| g.act(n, w * hd).unwrap()))
    }

    /// Writes rows `pos0..pos0 + n` of each of `seqs` (in order) into the activations.
    fn fill(&self, g: &Gpu, seqs: &[(&Seq, usize, usize)]) {
        let cat = |f: &dyn Fn(&Seq) -> (&[f32], usize)| -> Vec<f32> {
            seqs.iter()
                .flat_map(|&(s, pos0, n)| {
                    let (x, heads) = f(s);
                    s.rows(x, heads, pos0, n).to_vec()
                })
                .collect()
        };
        g.write(&self.0[0], &cat(&|s| (&s.q, s.n_head))).unwrap();
        g.write(&self.0[1], &cat(&|s| (&s.k, s.n_kv))).unwrap();
        g.write(&self.0[2], &cat(&|s| (&s.v, s.n_kv))).unwrap();
    }
}

/// Turns the streamed kernel on (and checks that the device took it) or off.
fn streamed(g: &Gpu, on: bool) {
    g.set_attn_v2(on);
    assert_eq!(
        g.attn_v2(),
        on,
        "the device refused the streamed kernel's shared memory"
    );
}

/// One pass of rows `pos0..pos0 + n` of `s` over its private cache `kv`.
fn lone_pass(g: &Gpu, s: &Seq, kv: &DevKv, acts: &Acts, pos0: usize, n: usize, p: AttnParams) {
    acts.fill(g, &[(s, pos0, n)]);
    let [q, k, v, o] = &acts.0;
    g.begin(n, pos0).unwrap();
    g.rope_attention_with(kv, 0, pos0, q, k, v, o, None, p)
        .unwrap();
    g.end().unwrap();
}

/// The decode of `s` at `pos` over its private cache (positions `0..pos` already there).
fn lone_decode(g: &Gpu, s: &Seq, kv: &DevKv, pos: usize, p: AttnParams) -> Vec<f32> {
    let acts = Acts::new(g, s, 1);
    lone_pass(g, s, kv, &acts, pos, 1, p);
    g.read(&acts.0[3]).unwrap()
}

/// Asserts `|a - b| <= tol` everywhere.
fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol, "{what} [{i}]: {a} vs {b}");
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// (n_head, n_kv, head size) for every group the test covers, at each head size.
fn shapes() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for hd in [64usize, 128, 256] {
        for (n_head, n_kv) in [(2usize, 2usize), (6, 2), (8, 2), (8, 1)] {
            v.push((n_head, n_kv, hd));
        }
    }
    v
}

#[test]
fn streamed_decode_matches_host_and_split_kernel() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let deepest = DEPTHS[DEPTHS.len() - 1];
    for (n_head, n_kv, hd) in shapes() {
        let s = Seq::new(n_head, n_kv, hd, deepest, 11 + hd as u64 + n_head as u64);
        let kv = g.kv(1, deepest, n_kv, hd, n_head).unwrap();
        // The cache of every position but the last, by one prompt pass; each decode below
        // rewrites its own position with the same values.
        let fill = Acts::new(&g, &s, deepest - 1);
        lone_pass(&g, &s, &kv, &fill, 0, deepest - 1, AttnParams::default());
        drop(fill);
        // Windows: none, one inside a tile, one across tiles and splits, a scale override.
        let params = [
            AttnParams::default(),
            AttnParams {
                scale: None,
                window: 5,
            },
            AttnParams {
                scale: Some(0.07),
                window: 1000,
            },
        ];
        for p in params {
            for &depth in &DEPTHS {
                let pos = depth - 1;
                let what = format!("heads {n_head}/{n_kv} hd {hd} {p:?} depth {depth}");
                streamed(&g, true);
                let new = lone_decode(&g, &s, &kv, pos, p);
                streamed(&g, false);
                let old = lone_decode(&g, &s, &kv, pos, p);
                close(&new, &old, TWIN_TOL, &format!("{what}: streamed vs split"));
                close(&new, &s.host(pos, p), HOST_TOL, &format!("{what}: vs host"));
            }
        }
    }
    streamed(&g, false);
}

#[test]
fn streamed_decode_graph_replays_match_eager_launches() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    streamed(&g, true);
    // Depth 4100 takes 64-position splits; 8 steps replay the graph captured at the first.
    let (start, steps) = (4100usize, 8usize);
    for (n_head, n_kv, hd, window) in [(6usize, 2usize, 128usize, 0usize), (8, 1, 64, 300)] {
        let p = AttnParams {
            scale: None,
            window,
        };
        let s = Seq::new(n_head, n_kv, hd, start + steps, 41 + hd as u64);
        let kv = g.kv(1, start + steps, n_kv, hd, n_head).unwrap();
        let fill = Acts::new(&g, &s, start);
        lone_pass(&g, &s, &kv, &fill, 0, start, p);
        drop(fill);
        let run = |g: &Gpu| -> Vec<Vec<f32>> {
            let acts = Acts::new(g, &s, 1);
            (start..start + steps)
                .map(|pos| {
                    lone_pass(g, &s, &kv, &acts, pos, 1, p);
                    g.read(&acts.0[3]).unwrap()
                })
                .collect()
        };
        let graphed = run(&g);
        g.set_graphs(false);
        let eager = run(&g);
        g.set_graphs(true);
        for (i, (a, b)) in graphed.iter().zip(&eager).enumerate() {
            assert!(
                same_bits(a, b),
                "hd {hd} step {i}: graph replay differs from eager"
            );
            close(a, &s.host(start + i, p), HOST_TOL, "graphed decode vs host");
        }
    }
    streamed(&g, false);
}

/// Block tables for sequences of `lengths` over a pool of `n_blocks` blocks of `bs`, handed
/// out in a scrambled order.
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

/// Sequences of `depths` in one paged pool of blocks of `bs`: a pass of their prompts (all
/// positions but the last), then `steps` passes of one decode row each (at their last
/// position, then past it): the decode passes' outputs `[n_seq, n_head * hd]`.
fn paged_decodes(
    g: &Gpu,
    seqs: &[Seq],
    depths: &[usize],
    bs: usize,
    steps: usize,
    p: AttnParams,
) -> Vec<Vec<f32>> {
    let s0 = &seqs[0];
    let lengths: Vec<usize> = depths.iter().map(|d| d + steps).collect();
    let n_blocks = lengths.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 2;
    let tables = scrambled_tables(&lengths, bs, n_blocks, 3 + bs as u64);
    let mut kv = g.kv(1, n_blocks * bs, s0.n_kv, s0.hd, s0.n_head).unwrap();
    let pass = |kv: &mut DevKv, acts: &Acts, rows: &[(usize, usize, usize)]| {
        // rows: (sequence, pos0, n)
        let parts: Vec<(&Seq, usize, usize)> =
            rows.iter().map(|&(i, p0, n)| (&seqs[i], p0, n)).collect();
        acts.fill(g, &parts);
        let mut start = 0;
        let ps: Vec<PagedSeq<'_>> = rows
            .iter()
            .map(|&(i, pos0, n)| {
                start += n;
                PagedSeq {
                    rows: start - n..start,
                    pos0,
                    table: &tables[i],
                }
            })
            .collect();
        let [q, k, v, o] = &acts.0;
        g.begin(start, 0).unwrap();
        g.attention_paged(kv, 0, bs, &ps, q, k, v, o, None, p)
            .unwrap();
        g.end().unwrap();
    };
    let prompts: Vec<(usize, usize, usize)> = depths
        .iter()
        .enumerate()
        .filter(|&(_, &d)| d > 1)
        .map(|(i, &d)| (i, 0, d - 1))
        .collect();
    if !prompts.is_empty() {
        let n: usize = prompts.iter().map(|r| r.2).sum();
        pass(&mut kv, &Acts::new(g, s0, n), &prompts);
    }
    let dec = Acts::new(g, s0, depths.len());
    (0..steps)
        .map(|t| {
            let rows: Vec<_> = depths
                .iter()
                .enumerate()
                .map(|(i, &d)| (i, d - 1 + t, 1))
                .collect();
            pass(&mut kv, &dec, &rows);
            g.read(&dec.0[3]).unwrap()
        })
        .collect()
}

#[test]
fn streamed_paged_decode_matches_lone_rows_bit_for_bit() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let depths = [1usize, 3, 7, 33, 1023, 4097];
    let steps = 3;
    for (n_head, n_kv, hd, window) in [
        (6usize, 2usize, 128usize, 0usize),
        (8, 1, 64, 0),
        (4, 1, 256, 0),
        (8, 2, 128, 40),
    ] {
        let p = AttnParams {
            scale: None,
            window,
        };
        let seqs: Vec<Seq> = depths
            .iter()
            .enumerate()
            .map(|(i, &d)| Seq::new(n_head, n_kv, hd, d + steps, 500 + 7 * i as u64))
            .collect();
        let w = n_head * hd;
        for bs in [16usize, 5] {
            streamed(&g, true);
            let graphed = paged_decodes(&g, &seqs, &depths, bs, steps, p);
            g.set_graphs(false);
            let eager = paged_decodes(&g, &seqs, &depths, bs, steps, p);
            g.set_graphs(true);
            streamed(&g, false);
            let split = paged_decodes(&g, &seqs, &depths, bs, steps, p);
            streamed(&g, true);
            for t in 0..steps {
                let what = format!("heads {n_head}/{n_kv} hd {hd} window {window} bs {bs}");
                assert!(
                    same_bits(&graphed[t], &eager[t]),
                    "{what} step {t}: graph replay differs from eager"
                );
                close(
                    &graphed[t],
                    &split[t],
                    TWIN_TOL,
                    &format!("{what}: vs split"),
                );
                for (i, s) in seqs.iter().enumerate() {
                    let pos = depths[i] - 1 + t;
                    let row = &graphed[t][i * w..(i + 1) * w];
                    close(row, &s.host(pos, p), HOST_TOL, &format!("{what} seq {i}"));
                }
            }
            // Each sequence alone over a private cache: the same bits at every step.
            for (i, s) in seqs.iter().enumerate() {
                let total = depths[i] + steps;
                let kv = g.kv(1, total, n_kv, hd, n_head).unwrap();
                if depths[i] > 1 {
                    let fill = Acts::new(&g, s, depths[i] - 1);
                    lone_pass(&g, s, &kv, &fill, 0, depths[i] - 1, p);
                }
                for (t, out) in graphed.iter().enumerate() {
                    let lone = lone_decode(&g, s, &kv, depths[i] - 1 + t, p);
                    assert!(
                        same_bits(&lone, &out[i * w..(i + 1) * w]),
                        "heads {n_head}/{n_kv} hd {hd} bs {bs} seq {i} step {t}: paged row \
                         differs from the lone sequence"
                    );
                }
            }
        }
    }
    streamed(&g, false);
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Dev benchmark (ignored; run on the GPU machine with `--ignored --nocapture`): the decode
/// attention of a synthetic Llama 3.2 3B step (28 layers, 24 query heads, 8 KV heads of 128)
/// at depths 4096 and 16384, split kernel and streamed kernel interleaved over 5 rounds, as
/// graphed passes of 28 `rope_attention` calls (cache write, split, combine). Prints µs per
/// layer and the K/V bytes read per second. Cache contents are not initialized (timing only).
#[test]
#[ignore]
fn bench_decode_attention_3b_shape() {
    let Some(g) = gpu() else { return };
    let _l = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let (n_layer, n_head, n_kv, hd) = (28usize, 24usize, 8usize, 128usize);
    let deepest = 16384;
    let kv = g.kv(n_layer, deepest + 1, n_kv, hd, n_head).unwrap();
    let s = Seq::new(n_head, n_kv, hd, 1, 5);
    let acts = Acts::new(&g, &s, 1);
    acts.fill(&g, &[(&s, 0, 1)]);
    let [q, k, v, o] = &acts.0;
    let passes = 40;
    let run = |pos: usize| -> f64 {
        let t = std::time::Instant::now();
        for _ in 0..passes {
            g.begin(1, pos).unwrap();
            for layer in 0..n_layer {
                g.rope_attention_with(&kv, layer, pos, q, k, v, o, None, AttnParams::default())
                    .unwrap();
            }
            g.end().unwrap();
        }
        g.sync().unwrap();
        t.elapsed().as_secs_f64() / (passes * n_layer) as f64
    };
    println!("| depth | kernel | us/layer | K+V TB/s |");
    println!("| ---: | --- | ---: | ---: |");
    for depth in [4096usize, deepest] {
        let pos = depth - 1;
        let bytes = (2 * n_kv * depth * hd * 2) as f64;
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..5 {
            for (i, on) in [false, true].into_iter().enumerate() {
                streamed(&g, on);
                run(pos); // capture the graph
                times[i].push(run(pos));
            }
        }
        for (i, name) in ["attn_split", "attn_decode"].into_iter().enumerate() {
            let t = median(&mut times[i]);
            println!(
                "| {depth} | {name} | {:.1} | {:.2} |",
                t * 1e6,
                bytes / t / 1e12
            );
        }
    }
    streamed(&g, false);
}
