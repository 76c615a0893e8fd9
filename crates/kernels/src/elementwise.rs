//! Vectorized element-wise ops for the fast CPU backend, each with the scalar reference in
//! [`crate::reference`] as its twin: SwiGLU and GeGLU with a polynomial `exp` (the reference calls
//! libm's `expf` one element at a time, which made SwiGLU a few percent of a prefill).
//!
//! Compiled for AVX-512F or AVX2 + FMA where present (one generic body, `#[target_feature]`
//! instantiations chosen at run time), baseline x86-64 otherwise.

/// `e^x`, vectorizable: `x` clamped to `[−87, 88]`, `2^n · p(r)` with `r = x − n ln 2`,
/// `|r| ≤ ln 2 / 2`, a degree-6 Taylor polynomial (relative error ≈ 2e-7).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    // Round to nearest by the 1.5 · 2^23 trick (no SSE4.1 `roundps` needed to vectorize).
    let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
    // ln 2 in two parts (Cody–Waite), so `r` stays exact for large |n|.
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    f32::from_bits(((n as i32 + 127) as u32) << 23) * p
}

#[inline(always)]
fn swiglu_body(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = x / (1.0 + exp_fast(-x)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn swiglu_avx512(gate: &mut [f32], up: &[f32]) {
    swiglu_body(gate, up);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    swiglu_body(gate, up);
}

/// SwiGLU in place on the gate, `gate[i] = silu(gate[i]) · up[i]`, within ≈ 1e-6 relative of
/// [`crate::reference::swiglu`].
///
/// # Panics
/// If the lengths differ (as the reference).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    #[cfg(target_arch = "x86_64")]
    {
        let f = crate::cpu::CpuFeatures::allowed();
        if f.avx512f {
            // SAFETY: AVX-512F is present.
            return unsafe { swiglu_avx512(gate, up) };
        }
        if f.avx2 && f.fma {
            // SAFETY: AVX2 and FMA are present.
            return unsafe { swiglu_avx2(gate, up) };
        }
    }
    swiglu_body(gate, up);
}

#[inline(always)]
fn geglu_body(gate: &mut [f32], up: &[f32]) {
    // gelu_tanh(x) = 0.5·x·(1 + tanh(u)) = x / (1 + e^(−2u)), u = √(2/π)·(x + 0.044715·x³).
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let z = TWO_SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = x / (1.0 + exp_fast(-z)) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn geglu_avx512(gate: &mut [f32], up: &[f32]) {
    geglu_body(gate, up);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    geglu_body(gate, up);
}

/// GeGLU in place on the gate, `gate[i] = gelu_tanh(gate[i]) · up[i]`, within ≈ 1e-6
/// (relative, or absolute near 0) of [`crate::reference::geglu`].
///
/// # Panics
/// If the lengths differ (as the reference).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up differ in length");
    #[cfg(target_arch = "x86_64")]
    {
        let f = crate::cpu::CpuFeatures::allowed();
        if f.avx512f {
            // SAFETY: AVX-512F is present.
            return unsafe { geglu_avx512(gate, up) };
        }
        if f.avx2 && f.fma {
            // SAFETY: AVX2 and FMA are present.
            return unsafe { geglu_avx2(gate, up) };
        }
    }
    geglu_body(gate, up);
}

/// `dst[i] = f16(src[i])` (round to nearest even, as `half::f16::from_f32`), with F16C's
/// `vcvtps2ph` where present. The prompt's KV-cache append converts a whole prompt at once.
///
/// # Panics
/// If the lengths differ.
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16_slice: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().f16c {
        // SAFETY: AVX and F16C are present (F16C implies AVX support in the detection).
        return unsafe { f32_to_f16_f16c(src, dst) };
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

/// `dst[i] = f32(src[i])` (exact), with F16C's `vcvtph2ps` where present.
///
/// # Panics
/// If the lengths differ.
pub fn f16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16_to_f32_slice: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().f16c {
        // SAFETY: AVX and F16C are present.
        return unsafe { f16_to_f32_f16c(src, dst) };
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(h).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f32_to_f16_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::{__m128i, _mm_storeu_si128, _mm256_cvtps_ph, _mm256_loadu_ps};
    let n8 = src.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= n8 <= both lengths (equal, asserted by the caller).
        unsafe {
            let h = _mm256_cvtps_ph::<0>(_mm256_loadu_ps(src.as_ptr().add(i))); // 0: nearest
            _mm_storeu_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
        }
    }
    for (d, &x) in dst[n8..].iter_mut().zip(&src[n8..]) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_to_f32_f16c(src: &[u16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let n8 = src.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        // SAFETY: i + 8 <= n8 <= both lengths.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for (d, &h) in dst[n8..].iter_mut().zip(&src[n8..]) {
        *d = half::f16::from_bits(h).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversions_match_half_on_awkward_lengths_and_specials() {
        let special = [
            0.0f32,
            -0.0,
            1.0,
            65504.0,
            65520.0, // rounds to inf
            1e-8,    // subnormal / zero
            6.1e-5,
            -3.0e-6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + 1.0 / 2048.0, // a tie
        ];
        for n in [0usize, 1, 3, 7, 8, 33, 1023] {
            let x: Vec<f32> = (0..n)
                .map(|i| {
                    special
                        .get(i)
                        .copied()
                        .unwrap_or(((i * 7919 % 2001) as f32 - 1000.0) * 0.0731)
                })
                .collect();
            let mut h = vec![0u16; n];
            f32_to_f16_slice(&x, &mut h);
            for (i, (&a, &b)) in h.iter().zip(&x).enumerate() {
                assert_eq!(a, half::f16::from_f32(b).to_bits(), "n {n} [{i}] {b}");
            }
            let mut back = vec![0f32; n];
            f16_to_f32_slice(&h, &mut back);
            for (i, (&a, &b)) in back.iter().zip(&h).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    half::f16::from_bits(b).to_f32().to_bits(),
                    "[{i}]"
                );
            }
        }
        let mut h = [0u16; 1];
        f32_to_f16_slice(&[f32::NAN], &mut h);
        assert!(half::f16::from_bits(h[0]).is_nan());
    }

    #[test]
    fn exp_fast_tracks_libm() {
        let mut x = -90.0f32;
        while x <= 90.0 {
            let (got, want) = (exp_fast(x), x.clamp(-87.0, 88.0).exp());
            assert!(
                (got - want).abs() <= 1e-6 * want,
                "exp({x}) = {got}, libm {want}"
            );
            x += 0.0137;
        }
    }

    #[test]
    fn swiglu_matches_reference_on_awkward_lengths() {
        for n in [0usize, 1, 3, 7, 33, 1023, 8192 + 5] {
            let g0: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.37)
                .collect();
            let up: Vec<f32> = (0..n)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.11)
                .collect();
            let (mut got, mut want) = (g0.clone(), g0.clone());
            swiglu(&mut got, &up);
            crate::reference::swiglu(&mut want, &up);
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-6 * b.abs() + 1e-30,
                    "n {n} [{i}]: {a} vs reference {b}"
                );
            }
        }
    }

    #[test]
    fn geglu_matches_reference_on_awkward_lengths() {
        for n in [0usize, 1, 3, 7, 33, 1023, 8192 + 5] {
            let g0: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.19)
                .collect();
            let up: Vec<f32> = (0..n)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.11)
                .collect();
            let (mut got, mut want) = (g0.clone(), g0.clone());
            geglu(&mut got, &up);
            crate::reference::geglu(&mut want, &up);
            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                // tanh-GELU through exp: relative error ≈ 1e-6, absolute where the value is
                // tiny (large negative inputs, where the result underflows towards 0).
                assert!(
                    (a - b).abs() <= 4e-6 * b.abs() + 1e-6,
                    "n {n} [{i}] x {}: {a} vs reference {b}",
                    g0[i]
                );
            }
        }
    }
}
