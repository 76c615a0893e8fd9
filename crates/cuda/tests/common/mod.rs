//! What the device tests share: the one device of a test binary (or a fresh one), SKIPPED
//! without a device unless `DAMASCUS_REQUIRE_CUDA=1`, and the test value generators.
#![allow(dead_code)] // each test binary uses its own part

use std::sync::{Arc, OnceLock};

use damascus_cuda::{AttnParams, CudaError, Gpu};

/// The test binary's one device (opened once, shared by its tests).
pub fn gpu() -> Option<Arc<Gpu>> {
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

/// A device of the test's own (for settings that are per `Gpu`).
pub fn own_gpu() -> Option<Arc<Gpu>> {
    let required = std::env::var("DAMASCUS_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(CudaError::NoDevice(why)) if !required => {
            eprintln!("SKIPPED: no CUDA device ({why})");
            None
        }
        Err(e) => panic!("opening the GPU failed: {e}"),
    }
}

/// Deterministic pseudo-random floats in [-1, 1) (an xorshift).
pub fn randn(n: usize, seed: u64) -> Vec<f32> {
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

/// `v` rounded to f16 and back (what an f16 cache holds).
pub fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| damascus_quant::fp::fp16_to_f32(damascus_quant::fp::f32_to_fp16(x)))
        .collect()
}

/// The f64 host reference of one query: `q` `[n_head * hd]` at position `pos` against the key
/// and value rows `key(kv_head, p)` / `value(kv_head, p)` (`[hd]` each) of the positions its
/// window sees, scores times `params.scale` (default 1/√hd); query head h reads KV head
/// h / (n_head / n_kv). Returns `[n_head * hd]`.
#[allow(clippy::too_many_arguments)]
pub fn host_attention<'a>(
    q: &[f32],
    n_head: usize,
    n_kv: usize,
    hd: usize,
    pos: usize,
    params: AttnParams,
    key: impl Fn(usize, usize) -> &'a [f32],
    value: impl Fn(usize, usize) -> &'a [f32],
) -> Vec<f32> {
    let group = n_head / n_kv;
    let scale = f64::from(params.scale.unwrap_or(1.0 / (hd as f32).sqrt()));
    let lo = match params.window {
        0 => 0,
        w => (pos + 1).saturating_sub(w),
    };
    let mut out = vec![0f32; n_head * hd];
    for h in 0..n_head {
        let kvh = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f64> = (lo..=pos)
            .map(|p| {
                qh.iter()
                    .zip(key(kvh, p))
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let l: f64 = e.iter().sum();
        let mut acc = vec![0f64; hd];
        for (&e, p) in e.iter().zip(lo..=pos) {
            for (a, &v) in acc.iter_mut().zip(value(kvh, p)) {
                *a += e * f64::from(v);
            }
        }
        for (o, a) in out[h * hd..(h + 1) * hd].iter_mut().zip(&acc) {
            *o = (a / l) as f32;
        }
    }
    out
}
