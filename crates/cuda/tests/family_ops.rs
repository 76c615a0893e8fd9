//! The model-family ops (GeGLU, bias add, per-head RMSNorm, scale, soft-cap) against host
//! twins on random inputs with awkward sizes (1, 3, 7, 33 rows; widths with tails).
//!
//! Runs only with `--features cuda`. Without a device each test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine) turns that into a failure.
#![cfg(feature = "cuda")]

mod common;

use common::gpu;

/// Deterministic pseudo-random floats in [-scale, scale) (an xorshift).
fn randn(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(a) - b).abs() <= tol * (1.0 + b.abs()),
            "{what} [{i}]: {a} vs {b}"
        );
    }
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn geglu_matches_host_and_keeps_its_q8_shadow() {
    let Some(g) = gpu() else { return };
    for (n, w) in [(1usize, 32usize), (3, 96), (7, 256), (33, 64)] {
        let gate = randn(n * w, 1 + n as u64, 4.0);
        let up = randn(n * w, 2 + n as u64, 2.0);
        let (ga, ua) = (g.act(n, w).unwrap(), g.act(n, w).unwrap());
        g.write(&ga, &gate).unwrap();
        g.write(&ua, &up).unwrap();
        g.begin(n, 0).unwrap();
        g.geglu(&ga, &ua).unwrap();
        g.end().unwrap();
        let want: Vec<f64> = gate
            .iter()
            .zip(&up)
            .map(|(&a, &b)| gelu_tanh(f64::from(a)) * f64::from(b))
            .collect();
        close(
            &g.read(&ga).unwrap(),
            &want,
            1e-5,
            &format!("geglu [{n}, {w}]"),
        );
    }
}

#[test]
fn bias_scale_and_softcap_match_host() {
    let Some(g) = gpu() else { return };
    for (n, w) in [(1usize, 1usize), (3, 7), (7, 33), (33, 1023)] {
        let x = randn(n * w, 3 + w as u64, 30.0);
        let b = randn(w, 4 + w as u64, 1.0);
        let xa = g.act(n, w).unwrap();
        let bv = g.upload_f32(&b).unwrap();
        g.write(&xa, &x).unwrap();
        g.begin(n, 0).unwrap();
        g.add_bias(&xa, &bv).unwrap();
        g.scale(&xa, 0.75).unwrap();
        g.softcap(&xa, 15.0).unwrap();
        g.end().unwrap();
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let y = (f64::from(v) + f64::from(b[i % w])) * 0.75;
                15.0 * (y / 15.0).tanh()
            })
            .collect();
        close(
            &g.read(&xa).unwrap(),
            &want,
            1e-5,
            &format!("bias/scale/softcap [{n}, {w}]"),
        );
        assert!(g.softcap(&xa, 0.0).is_err());
        assert!(g.add_bias(&xa, &g.upload_f32(&[1.0; 2]).unwrap()).is_err() || w == 2);
    }
}

#[test]
fn rms_norm_heads_matches_host() {
    let Some(g) = gpu() else { return };
    for (n, heads, hd) in [
        (1usize, 1usize, 64usize),
        (3, 7, 128),
        (7, 2, 256),
        (33, 3, 48),
    ] {
        let x = randn(n * heads * hd, 5 + hd as u64, 3.0);
        let w = randn(hd, 6 + hd as u64, 1.5);
        let xa = g.act(n, heads * hd).unwrap();
        let wv = g.upload_f32(&w).unwrap();
        g.write(&xa, &x).unwrap();
        g.begin(n, 0).unwrap();
        g.rms_norm_heads(&xa, &wv, 1e-6, hd).unwrap();
        g.end().unwrap();
        let want: Vec<f64> = x
            .chunks_exact(hd)
            .flat_map(|row| {
                let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                let s = 1.0 / (ss / hd as f64 + 1e-6).sqrt();
                row.iter()
                    .zip(&w)
                    .map(move |(&v, &wi)| f64::from(v) * s * f64::from(wi))
                    .collect::<Vec<_>>()
            })
            .collect();
        close(
            &g.read(&xa).unwrap(),
            &want,
            2e-5,
            &format!("rms_norm_heads [{n}, {heads}, {hd}]"),
        );
        assert!(g.rms_norm_heads(&xa, &wv, 1e-6, hd + 1).is_err());
    }
}
