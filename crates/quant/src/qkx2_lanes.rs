//! Lane-parallel twin of ggml's `make_qkx2_quants` (the affine scale/min search behind Q2_K,
//! Q4_K and Q5_K), bit-identical with the scalar reference in `quant_k.rs`.
//!
//! The scalar search is bound by the latency of its strictly ordered f32 sums (they may not
//! be reassociated without changing bits). Here the `G` groups of one super-block run side by
//! side: each lane performs exactly the scalar sequence of rounded operations for its group,
//! so results are unchanged while the compiler can put the lanes in SIMD registers.
//! A test checks this against the scalar version on many random super-blocks.

// Lane code indexes `[i][g]` pairs on purpose: it mirrors the scalar loops one to one.
#![allow(clippy::needless_range_loop)]

use crate::fp::nearest_int;
use crate::quant_k::Qkx2;

/// Runs the `make_qkx2_quants` search for `G` groups of `N` values at once.
///
/// `x`, `weights`: `[G * N]` f32, group-major. Writes `l_out` (`[G * N]`, quants in
/// `0..=nmax`) and returns per group `(scale, min)` with `min` the non-negative offset.
pub(crate) fn make_qkx2_quants_lanes<const N: usize, const G: usize>(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> ([f32; G], [f32; G]) {
    // Transposed copies: xt[i][g] is value i of group g.
    let mut xt = [[0f32; G]; N];
    let mut wt = [[0f32; G]; N];
    for g in 0..G {
        for i in 0..N {
            xt[i][g] = x[g * N + i];
            wt[i][g] = weights[g * N + i];
        }
    }
    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x = [0f32; G];
    for g in 0..G {
        sum_x[g] = sum_w[g] * xt[0][g];
    }
    for i in 1..N {
        for g in 0..G {
            let v = xt[i][g];
            if v < min[g] {
                min[g] = v;
            }
            if v > max[g] {
                max[g] = v;
            }
            let w = wt[i][g];
            sum_w[g] += w;
            sum_x[g] += w * v;
        }
    }
    let mut flat = [false; G];
    for g in 0..G {
        if min[g] > 0.0 {
            min[g] = 0.0;
        }
        flat[g] = max[g] == min[g];
    }
    let nmax_f = p.nmax as f32;
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };

    let mut lt = [[0u8; G]; N];
    let mut scale = [0f32; G];
    let mut best_error = [0f32; G];
    let mut iscale = [0f32; G];
    for g in 0..G {
        iscale[g] = nmax_f / (max[g] - min[g]);
        scale[g] = 1.0 / iscale[g];
    }
    for i in 0..N {
        for g in 0..G {
            let l = nearest_int(iscale[g] * (xt[i][g] - min[g])).clamp(0, p.nmax);
            lt[i][g] = l as u8;
            let diff = scale[g] * f32::from(lt[i][g]) + min[g] - xt[i][g];
            best_error[g] += wt[i][g] * err(diff);
        }
    }
    if p.nstep >= 1 {
        let mut laux = [[0u8; G]; N];
        for is in 0..=p.nstep {
            for g in 0..G {
                iscale[g] = (p.rmin + p.rdelta * is as f32 + nmax_f) / (max[g] - min[g]);
            }
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; G], [0f32; G], [0f32; G]);
            for i in 0..N {
                for g in 0..G {
                    let l = nearest_int(iscale[g] * (xt[i][g] - min[g])).clamp(0, p.nmax);
                    laux[i][g] = l as u8;
                    let w = wt[i][g];
                    let lf = l as f32;
                    sum_l[g] += w * lf;
                    sum_l2[g] += w * lf * lf;
                    sum_xl[g] += w * lf * xt[i][g];
                }
            }
            let mut d = [0f32; G];
            let mut this_scale = [0f32; G];
            let mut this_min = [0f32; G];
            for g in 0..G {
                d[g] = sum_w[g] * sum_l2[g] - sum_l[g] * sum_l[g];
                this_scale[g] = (sum_w[g] * sum_xl[g] - sum_x[g] * sum_l[g]) / d[g];
                this_min[g] = (sum_l2[g] * sum_x[g] - sum_l[g] * sum_xl[g]) / d[g];
                if this_min[g] > 0.0 {
                    this_min[g] = 0.0;
                    this_scale[g] = sum_xl[g] / sum_l2[g];
                }
            }
            // Computed for every lane; only lanes with D > 0 use it (as in the scalar code).
            let mut cur_error = [0f32; G];
            for i in 0..N {
                for g in 0..G {
                    let diff = this_scale[g] * f32::from(laux[i][g]) + this_min[g] - xt[i][g];
                    cur_error[g] += wt[i][g] * err(diff);
                }
            }
            for g in 0..G {
                if !flat[g] && d[g] > 0.0 && cur_error[g] < best_error[g] {
                    for i in 0..N {
                        lt[i][g] = laux[i][g];
                    }
                    best_error[g] = cur_error[g];
                    scale[g] = this_scale[g];
                    min[g] = this_min[g];
                }
            }
        }
    }
    let mut the_min = [0f32; G];
    for g in 0..G {
        if flat[g] {
            scale[g] = 0.0;
            for i in 0..N {
                lt[i][g] = 0;
            }
        }
        the_min[g] = -min[g];
        for i in 0..N {
            l_out[g * N + i] = lt[i][g];
        }
    }
    (scale, the_min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant_k::make_qkx2_quants;

    /// xorshift64* stream of f32 in a spread of magnitudes, with some flat groups.
    fn data(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            s.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let scale = [1e-3f32, 0.02, 1.0, 300.0];
        (0..n)
            .map(|i| {
                let r = next();
                let u = (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                let sc = scale[(r & 3) as usize];
                if (i / 16) % 7 == 3 { 0.25 } else { u * sc }
            })
            .collect()
    }

    fn check<const N: usize, const G: usize>(p: &Qkx2, seed: u64, abs_weights: bool) {
        let x = data(seed, N * G);
        let mut w = vec![0f32; N * G];
        for g in 0..G {
            let xs = &x[g * N..(g + 1) * N];
            let av = if abs_weights {
                0.0
            } else {
                let mut s2 = 0.0f32;
                for v in xs {
                    s2 += v * v;
                }
                (s2 / N as f32).sqrt()
            };
            for i in 0..N {
                w[g * N + i] = av + xs[i].abs();
            }
        }
        let mut l_lanes = vec![0u8; N * G];
        let (sc, mn) = make_qkx2_quants_lanes::<N, G>(p, &x, &w, &mut l_lanes);
        for g in 0..G {
            let mut l = [0u8; N];
            let (s, m) =
                make_qkx2_quants(p, &x[g * N..(g + 1) * N], &w[g * N..(g + 1) * N], &mut l);
            assert_eq!(
                (s.to_bits(), m.to_bits()),
                (sc[g].to_bits(), mn[g].to_bits()),
                "seed {seed} group {g}"
            );
            assert_eq!(
                &l[..],
                &l_lanes[g * N..(g + 1) * N],
                "seed {seed} group {g}"
            );
        }
    }

    #[test]
    fn lanes_match_scalar_reference() {
        let q4 = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let q5 = Qkx2 {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let q2 = Qkx2 {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        for seed in 0..300 {
            check::<32, 8>(&q4, seed, false);
            check::<32, 8>(&q5, seed + 1000, false);
            check::<16, 16>(&q2, seed + 2000, true);
        }
    }
}
