//! Fast row dequantization for the panel unpack of the K-quants that dominate Q4_K_M files
//! (Q4_K, Q6_K): reads the block bytes in place (no block copies) and is compiled for
//! AVX-512F where present. Bit-exact with `damascus_quant::dequantize_row` (the same f32
//! products in the same order); other types go through that function.

use damascus_quant::GgmlType;

/// Dequantizes `src` (whole blocks) into `dst` if `dtype` has a fast path here; returns
/// whether it did. `src.len()` must be `dst.len() / 256` blocks (checked by the caller).
pub(super) fn dequant_fast(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    let f: fn(&[u8], &mut [f32]) = match dtype {
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        _ => return false,
    };
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F is present.
        unsafe { with_avx512(f, src, dst) };
        return true;
    }
    f(src, dst);
    true
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn with_avx512(f: fn(&[u8], &mut [f32]), src: &[u8], dst: &mut [f32]) {
    // Calling through the pointer would lose the target features, so match again.
    if f as usize == q4_k as fn(&[u8], &mut [f32]) as usize {
        q4_k(src, dst)
    } else {
        q6_k(src, dst)
    }
}

#[inline(always)]
fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Q4_K: `d (f16) · dmin (f16) · scales[12] · qs[128]` per 256; `(d·sc)·q − dmin·m`.
#[inline(always)]
fn q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(256)) {
        let (d, dmin) = (f16(b[0], b[1]), f16(b[2], b[3]));
        let sc: &[u8] = &b[4..16];
        for c in 0..4 {
            let sm = |j: usize| -> (u8, u8) {
                if j < 4 {
                    (sc[j] & 63, sc[j + 4] & 63)
                } else {
                    (
                        (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4),
                        (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                    )
                }
            };
            let (s1, m1) = sm(2 * c);
            let (s2, m2) = sm(2 * c + 1);
            let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
            let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
            let qs = &b[16 + 32 * c..16 + 32 * c + 32];
            let (lo, hi) = y[64 * c..64 * c + 64].split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * f32::from(qs[l] & 0xf) - m1;
                hi[l] = d2 * f32::from(qs[l] >> 4) - m2;
            }
        }
    }
}

/// Q6_K: `ql[128] · qh[64] · scales[16] (i8) · d (f16)` per 256; `(d·sc)·(q − 32)`.
#[inline(always)]
fn q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
        let d = f16(b[208], b[209]);
        for h in 0..2 {
            let ql = &b[64 * h..64 * h + 64];
            let qh = &b[128 + 32 * h..128 + 32 * h + 32];
            for k in 0..4 {
                let qlk = &ql[32 * (k % 2)..32 * (k % 2) + 32];
                let shift = if k < 2 { 0 } else { 4 };
                for half in 0..2 {
                    let dl = d * f32::from(b[192 + 8 * h + 2 * k + half] as i8);
                    let out = &mut y[128 * h + 32 * k + 16 * half..][..16];
                    for (i, o) in out.iter_mut().enumerate() {
                        let l = 16 * half + i;
                        let q = ((qlk[l] >> shift) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
                        *o = dl * (i32::from(q) - 32) as f32;
                    }
                }
            }
        }
    }
}
