//! The attention kernels against a host reference (f64 over f16-rounded keys and values) on
//! random inputs with tails: the tensor-core flash prompt kernel and the CUDA-core one (head
//! sizes 64, 128, 256; GQA groups 1..8; prompts not a multiple of the 64-row tile; a prompt
//! appended to a cache that already holds positions), sliding windows and a scale override,
//! and decode split over the KV length at depths where the split grows past 32 positions.
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

use std::sync::{Arc, Mutex, OnceLock};

use damascus_cuda::{AttnParams, CudaError, DevKv, Gpu, decode_chunk};

/// Tests here switch the flash path on and off on the one shared device: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    let required = std::env::var("DAMASCUS_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match GPU.get_or_init(|| match Gpu::open(0) {
        Ok(g) => Ok(g),
        Err(CudaError::NoDevice(why)) => Err(why),
        Err(e) => panic!("opening the GPU failed: {e}"),
    }) {
        Ok(g) => Some(Arc::clone(g)),
        Err(why) if !required => {
            eprintln!("SKIPPED: no CUDA device ({why})");
            None
        }
        Err(why) => panic!("DAMASCUS_REQUIRE_CUDA=1 but no CUDA device: {why}"),
    }
}

/// Deterministic pseudo-random floats in [-1, 1) (an xorshift).
fn randn(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| damascus_quant::fp::fp16_to_f32(damascus_quant::fp::f32_to_fp16(x)))
        .collect()
}

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
        let group = n_head / n_kv;
        let scale = f64::from(self.params.scale.unwrap_or(1.0 / (hd as f32).sqrt()));
        let w = self.params.window;
        let lo = if w > 0 {
            (pos + 1).saturating_sub(w)
        } else {
            0
        };
        let mut out = vec![0f32; n_head * hd];
        for h in 0..n_head {
            let kvh = h / group;
            let qh = &self.q[(pos * n_head + h) * hd..(pos * n_head + h + 1) * hd];
            let scores: Vec<f64> = (lo..=pos)
                .map(|p| {
                    let kr = &self.kr[(p * n_kv + kvh) * hd..(p * n_kv + kvh + 1) * hd];
                    qh.iter()
                        .zip(kr)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for d in 0..hd {
                let acc: f64 = e
                    .iter()
                    .zip(lo..=pos)
                    .map(|(&e, p)| e * f64::from(self.vr[(p * n_kv + kvh) * hd + d]))
                    .sum();
                out[h * hd + d] = (acc / l) as f32;
            }
        }
        out
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
