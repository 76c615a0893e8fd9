//! Reference quantizers for the 256-element K-quant formats (Q2_K .. Q6_K, Q8_K),
//! bit-identical with llama.cpp's `quantize_row_*_ref` (the path `llama-quantize` takes
//! without an importance matrix).
//!
//! The search routines (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants` in
//! `ggml-quants.c`) are re-derived here with the same f32 operation order: ggml-base is
//! compiled without FMA or fast-math, so every `a*b + c` is two rounded operations and sums
//! run left to right. `int -> float` conversions happen where C's usual arithmetic
//! conversions put them (e.g. `w*x*l` is `(w*x)*(float)l`).

use crate::blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K, K_SCALE_SIZE, QK_K,
    get_scale_min_k4,
};
use crate::fp::{f32_to_fp16, fp16_to_f32, nearest_int};
use crate::qkx2_lanes::make_qkx2_quants_lanes;

/// ggml's threshold below which a group counts as all-zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Runs `f` over each (256 inputs, output block bytes) pair.
#[inline]
fn for_blocks<B: Block>(src: &[f32], dst: &mut [u8], mut f: impl FnMut(&[f32]) -> B) {
    for (x, out) in src
        .chunks_exact(B::ELEMS)
        .zip(dst.chunks_exact_mut(B::SIZE))
    {
        f(x).write(out);
    }
}

/// The value of largest magnitude (first wins ties) and that magnitude.
#[inline]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` (weights `x^2`) and no importance weights —
/// the only variant the reference quantizers use (Q6_K, groups of 16). Writes
/// `L[i] = q + nmax` with `q` in `-nmax..nmax` and returns the scale.
///
/// `w = x*x` and `w*x` are hoisted out of the trial loop; they are the same rounded values
/// ggml recomputes inside it, so the sums are unchanged.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32; 16], l_out: &mut [i8; 16]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        *l_out = [0; 16];
        return 0.0;
    }
    let mut w = [0f32; 16];
    let mut wx = [0f32; 16];
    for i in 0..16 {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    // Quants for a trial inverse scale, and the weighted sums (sum w*x*l, sum w*l*l).
    let trial = |iscale: f32, l: &mut [i32; 16]| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for i in 0..16 {
            let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l[i] = q;
            let lf = q as f32;
            sumlx += wx[i] * lf;
            suml2 += w[i] * lf * lf;
        }
        (sumlx, suml2)
    };
    let store = |l: &[i32; 16], l_out: &mut [i8; 16]| {
        for i in 0..16 {
            l_out[i] = (l[i] + nmax) as i8;
        }
    };
    let mut l = [0i32; 16];
    let (sumlx, suml2) = trial(-(nmax as f32) / max, &mut l);
    store(&l, l_out);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        let (sumlx, suml2) = trial(iscale, &mut l);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(&l, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse = true`: an initial rounding refined by up to five
/// coordinate-descent passes. Writes `L[i] = q + nmax`, returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (o, &v) in l_out.iter_mut().zip(x) {
            let w = v * v;
            let cur = f32::from(*o);
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*o) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for o in l_out.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Search parameters of ggml's `make_qkx2_quants`.
pub(crate) struct Qkx2 {
    /// Largest quant.
    pub(crate) nmax: i32,
    /// First trial offset added to `nmax`.
    pub(crate) rmin: f32,
    /// Step between trial offsets.
    pub(crate) rdelta: f32,
    /// Number of steps (trials are `0..=nstep`).
    pub(crate) nstep: i32,
    /// Minimise absolute instead of squared error.
    pub(crate) use_mad: bool,
}

/// ggml's `make_qkx2_quants`: affine `x ~ scale * L - min` fit by a grid search over inverse
/// scales with a weighted least-squares refit. Returns `(scale, min)` where `min` is the
/// non-negative offset subtracted (ggml's `*the_min`); writes `L` in `0..=nmax`.
// The scalar reference twin of `qkx2_lanes::make_qkx2_quants_lanes` (used by its test).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let nmax_f = p.nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
        l_out[i] = l as u8;
        let diff = scale * f32::from(l_out[i]) + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, p.nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit values (`L` in 0..4) the Q2_K/Q3_K way: byte `32c + l` holds weights
/// `128c' + l + 32k` (k = 0..4) at bit offset `2k`, for chunk `c` of each 128-half.
#[inline]
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Q2_K: 16 groups of 16, 4-bit scales and mins relative to f16 super-scales.
pub(crate) fn q2_k_row(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let params = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for_blocks(src, dst, |x| {
        let mut l = [0u8; QK_K];
        let mut weights = [0f32; QK_K]; // [16 groups * 16] f32
        for (w, v) in weights.iter_mut().zip(x) {
            *w = v.abs();
        }
        let (scales, mins) =
            make_qkx2_quants_lanes::<16, { QK_K / 16 }>(&params, x, &weights, &mut l);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for (&s, &m) in scales.iter().zip(&mins) {
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut b = BlockQ2_K {
            scales: [0; QK_K / 16],
            qs: [0; QK_K / 4],
            d: 0,
            dmin: 0,
        };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (o, &s) in b.scales.iter_mut().zip(&scales) {
                *o = nearest_int(iscale * s) as u8;
            }
            b.d = f32_to_fp16(max_scale / Q4SCALE);
        } else {
            b.d = f32_to_fp16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (o, &m) in b.scales.iter_mut().zip(&mins) {
                *o |= (nearest_int(iscale * m) << 4) as u8;
            }
            b.dmin = f32_to_fp16(max_min / Q4SCALE);
        } else {
            b.dmin = f32_to_fp16(0.0);
        }
        let (dall, dmall) = (fp16_to_f32(b.d), fp16_to_f32(b.dmin));
        for j in 0..QK_K / 16 {
            let d = dall * f32::from(b.scales[j] & 0xf);
            if d == 0.0 {
                continue;
            }
            let dm = dmall * f32::from(b.scales[j] >> 4);
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }
        pack_2bit(&l, &mut b.qs);
        b
    });
}

/// Q3_K: 16 groups of 16 signed 3-bit quants, 6-bit signed scales.
pub(crate) fn q3_k_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut b = BlockQ3_K {
            hmask: [0; QK_K / 8],
            qs: [0; QK_K / 4],
            scales: [0; 12],
            d: 0,
        };
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                let q = i32::from(nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    b.scales[j] = (q & 0xf) as u8;
                } else {
                    b.scales[j - 8] |= ((q & 0xf) << 4) as u8;
                }
                b.scales[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
            }
            b.d = f32_to_fp16(1.0 / iscale);
        } else {
            b.d = f32_to_fp16(0.0);
        }
        let dall = fp16_to_f32(b.d);
        let packed = crate::dequant::q3_k_scales(&b.scales);
        for j in 0..QK_K / 16 {
            let sc = i32::from(packed[j]) - 32;
            let d = dall * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }
        // High bit of weight j goes to hmask[j % 32], bit j / 32.
        let mut lu = [0u8; QK_K];
        for (j, (o, &v)) in lu.iter_mut().zip(&l).enumerate() {
            let mut v = v as u8;
            if v > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                v -= 4;
            }
            *o = v;
        }
        pack_2bit(&lu, &mut b.qs);
        b
    });
}

/// Packs eight 6-bit scales and mins the Q4_K/Q5_K way (inverse of [`get_scale_min_k4`]).
#[inline]
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut s = [0u8; K_SCALE_SIZE];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// Shared body of Q4_K / Q5_K: returns `(d, dmin, packed scales, L)` with `L` in `0..=nmax`.
fn k_scale_min_quants(x: &[f32], p: &Qkx2) -> (u16, u16, [u8; K_SCALE_SIZE], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut weights = [0f32; QK_K]; // [8 groups * 32] f32
    for (xs, ws) in x.chunks_exact(32).zip(weights.chunks_exact_mut(32)) {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in ws.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    }
    let (scales, mins) = make_qkx2_quants_lanes::<32, { QK_K / 32 }>(p, x, &weights, &mut l);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for (&s, &m) in scales.iter().zip(&mins) {
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f32_to_fp16(max_scale / 63.0);
    let dmin = f32_to_fp16(max_min / 63.0);
    let (dall, dmall) = (fp16_to_f32(d), fp16_to_f32(dmin));
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dl = dall * f32::from(sc);
        if dl == 0.0 {
            continue;
        }
        let dm = dmall * f32::from(m);
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dl).clamp(0, p.nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    (d, dmin, packed, l)
}

/// Q4_K: 8 groups of 32 unsigned 4-bit quants with 6-bit scales and mins.
pub(crate) fn q4_k_row(src: &[f32], dst: &mut [u8]) {
    let params = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for_blocks(src, dst, |x| {
        let (d, dmin, scales, l) = k_scale_min_quants(x, &params);
        let mut qs = [0u8; QK_K / 2];
        for (c, j) in (0..QK_K).step_by(64).enumerate() {
            for i in 0..32 {
                qs[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
        BlockQ4_K {
            d,
            dmin,
            scales,
            qs,
        }
    });
}

/// Q5_K: like Q4_K with 5-bit quants (high bits in `qh`).
pub(crate) fn q5_k_row(src: &[f32], dst: &mut [u8]) {
    let params = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for_blocks(src, dst, |x| {
        let (d, dmin, scales, l) = k_scale_min_quants(x, &params);
        let mut qs = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 8];
        for (c, n) in (0..QK_K).step_by(64).enumerate() {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                qs[32 * c + j] = l1 | (l2 << 4);
            }
        }
        BlockQ5_K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    });
}

/// Q6_K: 16 groups of 16 signed 6-bit quants with signed 8-bit scales.
pub(crate) fn q6_k_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..QK_K / 16 {
            let xs: &[f32; 16] = x[16 * ib..16 * ib + 16].try_into().expect("16 values");
            let ls: &mut [i8; 16] = (&mut l[16 * ib..16 * ib + 16])
                .try_into()
                .expect("16 values");
            let scale = make_qx_quants_rmse1(32, xs, ls);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        let mut b = BlockQ6_K {
            ql: [0; QK_K / 2],
            qh: [0; QK_K / 4],
            scales: [0; QK_K / 16],
            d: 0,
        };
        if max_abs_scale < GROUP_MAX_EPS {
            b.d = f32_to_fp16(0.0);
            return b;
        }
        let iscale = -128.0f32 / max_scale;
        b.d = f32_to_fp16(1.0 / iscale);
        for (o, &s) in b.scales.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        let dall = fp16_to_f32(b.d);
        for j in 0..QK_K / 16 {
            let d = dall * f32::from(b.scales[j]);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let q = |k: usize| l[j + i + 32 * k] as u8;
                b.ql[64 * h + i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
                b.ql[64 * h + i + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
                b.qh[32 * h + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
        b
    });
}

/// Q8_K: one f32 scale per 256 values, plus per-16 sums. An all-zero block gets zero
/// `bsums` (llama.cpp leaves them unwritten there).
pub(crate) fn q8_k_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let mut b = BlockQ8_K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        };
        let (max, amax) = signed_absmax(x);
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| i32::from(q)).sum::<i32>() as i16;
        }
        b.d = 1.0 / iscale;
        b
    });
}
