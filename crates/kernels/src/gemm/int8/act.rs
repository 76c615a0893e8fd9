//! One activation row quantized for the int8 kernels ([`super::QActs`]): per 32-block `b` the
//! scale `d = amax / 127`, `q = round_half_even(x / d)` as i8, and `d · Σ q` per 16 and per 32
//! elements. [`quantize_row_scalar`] is the twin; the AVX2 body gives the same bits (the same
//! f32 multiply, the same 1.5·2²³ rounding adds, exact integer sums) and hands any block with a
//! NaN, an infinity or a scale whose reciprocal overflows to the scalar code.

/// Quantizes `x` (`[k]` f32, `k` a multiple of 32) into `q` (`[k]` i8), `d` (`[k / 32]`),
/// `s16` (`[k / 16]`) and `s32` (`[k / 32]`), with SIMD when `simd` (AVX2 detected).
pub(super) fn quantize_row(
    simd: bool,
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s16: &mut [f32],
    s32: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        for b in 0..x.len() / 32 {
            let blk: &[f32; 32] = (&x[32 * b..][..32]).try_into().expect("32");
            let dst: &mut [i8; 32] = (&mut q[32 * b..][..32]).try_into().expect("32");
            // SAFETY: `simd` is only true when AVX2 was detected.
            let sums = unsafe { avx2::block(blk, dst) };
            match sums {
                Some((db, sums)) => store(b, db, sums, d, s16, s32),
                None => block_scalar(b, blk, dst, d, s16, s32),
            }
        }
        return;
    }
    let _ = simd;
    quantize_row_scalar(x, q, d, s16, s32);
}

/// The scalar twin of [`quantize_row`].
pub(super) fn quantize_row_scalar(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    s16: &mut [f32],
    s32: &mut [f32],
) {
    for b in 0..x.len() / 32 {
        let blk: &[f32; 32] = (&x[32 * b..][..32]).try_into().expect("32");
        let dst: &mut [i8; 32] = (&mut q[32 * b..][..32]).try_into().expect("32");
        block_scalar(b, blk, dst, d, s16, s32);
    }
}

fn block_scalar(
    b: usize,
    blk: &[f32; 32],
    dst: &mut [i8; 32],
    d: &mut [f32],
    s16: &mut [f32],
    s32: &mut [f32],
) {
    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let db = amax / 127.0;
    let id = if db > 0.0 { 1.0 / db } else { 0.0 };
    let mut sums = [0i32; 2];
    for (h, (o, xs)) in dst
        .chunks_exact_mut(16)
        .zip(blk.chunks_exact(16))
        .enumerate()
    {
        for (o, &v) in o.iter_mut().zip(xs) {
            // Round to nearest even by the 1.5 · 2^23 trick (|v · id| ≤ 127), so
            // the loop vectorizes without SSE4.1's roundps.
            let qi = ((v * id + 12_582_912.0) - 12_582_912.0) as i32;
            *o = qi as i8;
            sums[h] += qi;
        }
    }
    store(b, db, sums, d, s16, s32);
}

#[inline(always)]
fn store(b: usize, db: f32, sums: [i32; 2], d: &mut [f32], s16: &mut [f32], s32: &mut [f32]) {
    d[b] = db;
    s16[2 * b] = db * sums[0] as f32;
    s16[2 * b + 1] = db * sums[1] as f32;
    s32[b] = db * (sums[0] + sums[1]) as f32;
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use core::arch::x86_64::*;

    /// One 32-block: `Some((d, [Σ q of 0..16, Σ q of 16..32]))` with `dst` written, or `None`
    /// (nothing written) for a block the scalar code must take.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block(x: &[f32; 32], dst: &mut [i8; 32]) -> Option<(f32, [i32; 2])> {
        // SAFETY: loads of x[0..32] and a store of dst[0..32], both exactly 32 elements.
        unsafe {
            let p = x.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
            let mut m = _mm256_setzero_ps();
            let mut nan = _mm256_setzero_ps();
            for &x in &v {
                m = _mm256_max_ps(m, _mm256_and_ps(x, abs));
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            }
            if _mm256_movemask_ps(nan) != 0 {
                return None;
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
            let db = amax / 127.0;
            let id = if db > 0.0 { 1.0 / db } else { 0.0 };
            if !amax.is_finite() || !id.is_finite() {
                return None;
            }
            let (idv, magic) = (_mm256_set1_ps(id), _mm256_set1_ps(12_582_912.0));
            let mut qi = [_mm256_setzero_si256(); 4];
            for (o, &x) in qi.iter_mut().zip(&v) {
                let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, idv), magic), magic);
                *o = _mm256_cvttps_epi32(r);
            }
            let mut sums = [0i32; 2];
            for (h, s) in sums.iter_mut().enumerate() {
                let a = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
                let t = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
                let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
                *s = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)));
            }
            // |q| ≤ 127, so the saturating packs are exact; they interleave 128-bit lanes,
            // which the final permute undoes.
            let w01 = _mm256_packs_epi32(qi[0], qi[1]);
            let w23 = _mm256_packs_epi32(qi[2], qi[3]);
            let b = _mm256_packs_epi16(w01, w23);
            let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(dst.as_mut_ptr() as *mut __m256i, b);
            Some((db, sums))
        }
    }
}

impl super::QActs {
    /// What the int8 rows miss of `x` (`[n_tokens, k]` f32, the input they were quantized
    /// from): `x − d · q` per element, `[n_tokens, k]` f32. Quantized again, it gives a second
    /// int8 term that brings a matmul close to f32 activations (two-level activations).
    pub fn residual(&self, x: &[f32]) -> Vec<f32> {
        x.iter()
            .zip(&self.q)
            .enumerate()
            .map(|(i, (&v, &q))| v - f32::from(q) * self.d[i / 32])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SIMD and scalar give the same bits on ordinary rows and on blocks of zeros, tiny,
    /// huge, infinite and NaN values.
    #[test]
    fn simd_matches_scalar_bitwise() {
        #[cfg(target_arch = "x86_64")]
        if !crate::quantdot::Isa::Avx2.is_available() {
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for &k in &[32usize, 64, 96, 640, 2048] {
            let mut x: Vec<f32> = (0..k).map(|i| rnd() * [1.0, 30.0, 1e-3][i % 3]).collect();
            if k >= 96 {
                x[32..64].fill(0.0);
                x[64] = 1e-42;
                x[65] = -3e-41;
                x[70] = 3e38;
            }
            if k >= 640 {
                x[100] = f32::NAN;
                x[200] = f32::INFINITY;
                x[300..332].iter_mut().for_each(|v| *v = 1e-44);
                x[400] = 0.5 * 127.0; // an exact half after scaling
            }
            let nb = k / 32;
            let run = |simd: bool| {
                let (mut q, mut d) = (vec![0i8; k], vec![0f32; nb]);
                let (mut s16, mut s32) = (vec![0f32; 2 * nb], vec![0f32; nb]);
                quantize_row(simd, &x, &mut q, &mut d, &mut s16, &mut s32);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                (q, bits(&d), bits(&s16), bits(&s32))
            };
            assert_eq!(run(true), run(false), "k {k}");
        }
    }

    /// Two-level activations: the residual is `x − d·q` exactly, and the two int8 terms
    /// reconstruct `x` to within half a step of the second scale.
    #[test]
    fn residual_reconstructs_the_input() {
        let (n, k) = (3usize, 96usize);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * [1.0, 40.0, 1e-2][i % 3])
            .collect();
        let a = super::super::QActs::new(&x, n, k, None).unwrap();
        let r = a.residual(&x);
        for (i, ((&v, &q), &rv)) in x.iter().zip(&a.q).zip(&r).enumerate() {
            assert_eq!(rv, v - f32::from(q) * a.d[i / 32]);
        }
        let b = super::super::QActs::new(&r, n, k, None).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let y = f32::from(a.q[i]) * a.d[i / 32] + f32::from(b.q[i]) * b.d[i / 32];
            assert!(
                (y - v).abs() <= 0.5 * b.d[i / 32] * 1.001 + 1e-6 * v.abs(),
                "{i}: {y} vs {v}"
            );
        }
    }
}
