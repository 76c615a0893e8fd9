//! Scalar number conversions with ggml's exact semantics.
//!
//! * [`fp16_to_f32`] / [`bf16_to_f32`] widen exactly; NaN payloads are kept bit for bit
//!   (signalling NaNs stay signalling), which is what numpy (and so gguf-py) does.
//! * [`f32_to_fp16`] is ggml's `GGML_FP32_TO_FP16` as built without F16C (the ggml-base
//!   library that `llama-quantize` uses): round to nearest even, overflow to infinity,
//!   gradual underflow, and every NaN becomes the canonical quiet NaN `0x7E00` (sign kept).
//! * [`f32_to_bf16`] is ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaNs forced quiet
//!   by setting bit 6 of the truncated pattern.
//! * [`nearest_int`] is ggml's rounding via the `1.5 * 2^23` magic constant (round half to
//!   even, valid for |x| <= 2^22).

/// Widens IEEE binary16 bits to f32, exactly (NaN payload and sign kept, no quieting).
#[inline]
pub fn fp16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal half: man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
            sign | v.to_bits()
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Widens bfloat16 bits to f32 (a shift; exact for every pattern).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Narrows f32 to IEEE binary16 bits exactly like ggml's software `GGML_FP32_TO_FP16`.
#[inline]
pub fn f32_to_fp16(f: f32) -> u16 {
    let w = f.to_bits();
    let sign = ((w >> 16) & 0x8000) as u16;
    if (w << 1) > 0xff00_0000 {
        // Any NaN collapses to the canonical quiet NaN.
        return sign | 0x7e00;
    }
    // half::f16::from_f32 rounds to nearest even with gradual underflow and overflow to
    // infinity, which is what ggml's magic-constant code computes for every non-NaN input
    // (checked by a sweep test against a transliteration of the ggml formula).
    sign | (half::f16::from_f32(f32::from_bits(w & 0x7fff_ffff)).to_bits() & 0x7fff)
}

/// Narrows f32 to bfloat16 bits exactly like ggml's `GGML_FP32_TO_BF16`.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // Round to nearest even on the dropped 16 bits; wrapping matches the C u32 arithmetic.
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// ggml's `nearest_int`: adds `12582912.0` (1.5 * 2^23) so the integer lands in the low
/// mantissa bits, then reads them back. Rounds half to even. Only meaningful for
/// |x| <= 4194303; outside that range it returns the same garbage ggml would.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C's `(int)f` as compiled for x86-64 (`cvttss2si`): truncation toward zero, and the
/// "integer indefinite" value `i32::MIN` for NaN or out-of-range inputs. ggml's legacy
/// quantizers then narrow this to 8 bits, which we reproduce with `as u8`/`as i8`.
#[inline]
pub fn c_trunc_i32(f: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        i32::MIN
    } else {
        f as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct transliteration of ggml's magic-constant fp32 -> fp16 formula, used only as a
    /// test oracle for [`f32_to_fp16`].
    fn ggml_formula_fp32_to_fp16(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
        let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let mut bias = shl1_w & 0xff00_0000;
        if bias < 0x7100_0000 {
            bias = 0x7100_0000;
        }
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let exp_bits = (bits >> 13) & 0x7c00;
        let mantissa_bits = bits & 0x0fff;
        let nonsign = exp_bits + mantissa_bits;
        ((sign >> 16)
            | if shl1_w > 0xff00_0000 {
                0x7e00
            } else {
                nonsign
            }) as u16
    }

    #[test]
    fn fp16_widening_matches_half_for_non_nan() {
        for h in 0..=u16::MAX {
            let ours = fp16_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan());
                assert_eq!(ours.to_bits() & 0xffbf_ffff, theirs.to_bits() & 0xffbf_ffff);
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "h={h:#06x}");
            }
        }
    }

    #[test]
    fn fp16_narrowing_matches_ggml_formula() {
        // A strided sweep over all f32 bit patterns plus every value near half boundaries.
        let mut bits: u32 = 0;
        loop {
            let f = f32::from_bits(bits);
            assert_eq!(
                f32_to_fp16(f),
                ggml_formula_fp32_to_fp16(f),
                "bits={bits:#010x}"
            );
            match bits.checked_add(997) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for h in 0..=u16::MAX {
            let f = fp16_to_f32(h);
            for delta in [-2i32, -1, 0, 1, 2] {
                let b = f.to_bits().wrapping_add_signed(delta);
                let g = f32::from_bits(b);
                assert_eq!(
                    f32_to_fp16(g),
                    ggml_formula_fp32_to_fp16(g),
                    "bits={b:#010x}"
                );
            }
            // Exact midpoints between neighbouring halves.
            let next = fp16_to_f32(h.wrapping_add(1));
            if f.is_finite() && next.is_finite() && (f.to_bits() >> 31) == (next.to_bits() >> 31) {
                let mid = ((f64::from(f) + f64::from(next)) / 2.0) as f32;
                assert_eq!(
                    f32_to_fp16(mid),
                    ggml_formula_fp32_to_fp16(mid),
                    "mid of {h:#06x}"
                );
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.49), -3);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie -> even
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    }
}
