//! AVX-512BW and AVX-512 VNNI dot products (64 bytes per op).
//!
//! Each kernel has one generic body instantiated twice:
//! - `VNNI = false` (AVX-512BW): `vpmaddubsw` then `vpmaddwd` + add;
//! - `VNNI = true`: `vpdpwssd` fuses the scale multiply-add for K-quants, and
//!   `vpdpbusd` does u8 × i8 → i32 directly for the legacy 32-element types.
//!
//! Same argument contract as the AVX2 module; the shorter operand bounds the work.
//! The AVX-512 intrinsics are stable since Rust 1.89.

use core::arch::x86_64::*;

use super::avx2::{f16_at, f16_at_end, hsum_ps128, nibbles32, scales_mins_k4};
use super::{BlockQ8_0, BlockQ8_1, BlockQ8K, avx2};

/// Byte-shuffle masks (per 128-bit lane): lanes 0-1 take i16 `2s`, lanes 2-3 i16 `2s + 1`
/// (the scales of sub-blocks 2s and 2s + 1).
static SHUF_K4: [[u8; 64]; 4] = {
    let mut t = [[0u8; 64]; 4];
    let mut s = 0;
    while s < 4 {
        let mut i = 0;
        while i < 32 {
            let k = if i < 16 { 2 * s } else { 2 * s + 1 };
            t[s][2 * i] = 2 * k as u8;
            t[s][2 * i + 1] = 2 * k as u8 + 1;
            i += 1;
        }
        s += 1;
    }
    t
};

/// `vpermw` indices for Q6_K: 128-bit lane `k` of vector `v` takes i16 `4v + k`.
static PERM_Q6: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut v = 0;
    while v < 4 {
        let mut i = 0;
        while i < 32 {
            t[v][i] = (4 * v + i / 8) as u16;
            i += 1;
        }
        v += 1;
    }
    t
};

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    // SAFETY: caller guarantees 64 readable bytes at `p`.
    unsafe { _mm512_loadu_si512(p as *const _) }
}

#[inline(always)]
unsafe fn load2x256(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: caller guarantees 32 readable bytes at `p0` and at `p1`.
    unsafe {
        let lo = _mm256_loadu_si256(p0 as *const __m256i);
        let hi = _mm256_loadu_si256(p1 as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    // SAFETY: register-only AVX-512F/AVX ops.
    unsafe {
        let s = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        );
        avx2::hsum_ps(s)
    }
}

/// acc + Σ pairs (p16 · sc) in i32.
#[inline(always)]
unsafe fn madd_acc<const VNNI: bool>(acc: __m512i, p16: __m512i, sc: __m512i) -> __m512i {
    // SAFETY: register-only ops; the VNNI branch only exists in VNNI-enabled callers.
    unsafe {
        if VNNI {
            _mm512_dpwssd_epi32(acc, p16, sc)
        } else {
            _mm512_add_epi32(acc, _mm512_madd_epi16(p16, sc))
        }
    }
}

/// Σ u·s over groups of 4 bytes (u unsigned, s signed) as 16 i32.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(u: __m512i, s: __m512i) -> __m512i {
    // SAFETY: register-only ops; the VNNI branch only exists in VNNI-enabled callers.
    unsafe {
        if VNNI {
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
        } else {
            _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1))
        }
    }
}

#[inline(always)]
unsafe fn k4_body<const FIVE: bool, const VNNI: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let bb = if FIVE { 176 } else { 144 };
    let nb = a.len().min(w.len() / bb);
    let pf = super::prefetch_distance();
    // SAFETY: block i spans w[i*bb..(i+1)*bb], i < nb; the 64-byte qs loads
    // cover qs[0..128] within the block; q8 loads stay within a[i].qs.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let m1 = _mm512_set1_epi8(0x01);
        let mut acc = _mm512_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(i * bb);
            avx2::prefetch(b, pf, bb);
            let y = a.get_unchecked(i);
            let d = y.d * f16_at(b);
            let dmin = -y.d * f16_at(b.add(2));
            let sm = _mm256_cvtepu8_epi16(scales_mins_k4(b.add(4)));
            let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let bs8 = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let pm = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), bs8);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), acc_m);
            let scales = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sm));
            // Each 32-byte group of qs holds 64 elements: low nibbles then high
            // nibbles. Broadcasting it to both 256-bit halves and shifting the
            // upper half by 4 lays the 64 elements out contiguously, with no
            // cross-lane shuffle.
            let shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
            let (qs, mut hb) = if FIVE {
                let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(16) as *const __m256i));
                (b.add(48), h)
            } else {
                (b.add(16), _mm512_setzero_si512())
            };
            let one = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(1));
            let q8 = y.qs.as_ptr() as *const u8;
            let mut sumi = _mm512_setzero_si512();
            for (j, shuf) in SHUF_K4.iter().enumerate() {
                let raw =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * j) as *const __m256i));
                let mut q = _mm512_and_si512(_mm512_srlv_epi16(raw, shift), m4);
                if FIVE {
                    // Bit 2j (low half) / 2j+1 (high half) of each qh byte.
                    let h = _mm512_and_si512(_mm512_srlv_epi16(hb, one), m1);
                    q = _mm512_or_si512(q, _mm512_slli_epi16::<4>(h));
                    hb = _mm512_srli_epi16::<2>(hb);
                }
                let p = _mm512_maddubs_epi16(q, load(q8.add(64 * j)));
                let sc = _mm512_shuffle_epi8(scales, load(shuf.as_ptr()));
                sumi = madd_acc::<VNNI>(sumi, p, sc);
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum512(acc) + hsum_ps128(acc_m)
    }
}

#[inline(always)]
unsafe fn q6k_body<const VNNI: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let nb = a.len().min(w.len() / 210);
    let pf = super::prefetch_distance();
    // SAFETY: block i spans w[i*210..(i+1)*210], i < nb: ql loads 64n..64n+64,
    // qh loads 128+32n..+32, scales 192..208, d 208..210; q8 loads within a[i].
    unsafe {
        let m4 = _mm512_set1_epi8(0x0F);
        let m3 = _mm512_set1_epi8(0x03);
        let mut acc = _mm512_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(i * 210);
            avx2::prefetch(b, pf, 210);
            let y = a.get_unchecked(i);
            let d = y.d * f16_at_end(b.add(208));
            let q8 = y.qs.as_ptr() as *const u8;
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
            let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
            let mut sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), off));
            let sc512 = _mm512_castsi256_si512(sc16);
            for n in 0..2 {
                let ql = load(b.add(64 * n));
                let h = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
                let hq =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h), _mm256_srli_epi16::<2>(h));
                let lo = _mm512_or_si512(
                    _mm512_and_si512(ql, m4),
                    _mm512_slli_epi16::<4>(_mm512_and_si512(hq, m3)),
                );
                let hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                    _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srli_epi16::<4>(hq), m3)),
                );
                let pl = _mm512_maddubs_epi16(lo, load(q8.add(128 * n)));
                let ph = _mm512_maddubs_epi16(hi, load(q8.add(128 * n + 64)));
                let sl =
                    _mm512_permutexvar_epi16(load(PERM_Q6[2 * n].as_ptr() as *const u8), sc512);
                let sh =
                    _mm512_permutexvar_epi16(load(PERM_Q6[2 * n + 1].as_ptr() as *const u8), sc512);
                sumi = madd_acc::<VNNI>(sumi, pl, sl);
                sumi = madd_acc::<VNNI>(sumi, ph, sh);
            }
            acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        }
        hsum512(acc)
    }
}

/// [d0 × 8 | d1 × 8].
#[inline(always)]
unsafe fn two_scales(d0: f32, d1: f32) -> __m512 {
    // SAFETY: register-only AVX-512F ops.
    unsafe { _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d0), _mm512_set1_ps(d1)) }
}

/// Which legacy weight format a body handles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Legacy {
    Q8_0,
    Q4_0,
    Q5_0,
}

#[inline(always)]
unsafe fn legacy_body<const VNNI: bool>(kind: Legacy, w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let bb = match kind {
        Legacy::Q8_0 => 34,
        Legacy::Q4_0 => 18,
        Legacy::Q5_0 => 22,
    };
    let nb = a.len().min(w.len() / bb);
    let pf = super::prefetch_distance();
    let pairs = nb / 2;
    // SAFETY: blocks 2p and 2p+1 < nb lie inside w and a; loads are within
    // them (Q8_0: 2 + 32 bytes, Q4_0: 2 + 16, Q5_0: 2 + 4 + 16).
    unsafe {
        let mut acc = _mm512_setzero_ps();
        let zero = _mm512_setzero_si512();
        for p in 0..pairs {
            let b0 = w.as_ptr().add(2 * p * bb);
            avx2::prefetch(b0, pf, 2 * bb);
            let b1 = b0.add(bb);
            let (y0, y1) = (a.get_unchecked(2 * p), a.get_unchecked(2 * p + 1));
            let ya = load2x256(y0.qs.as_ptr() as *const u8, y1.qs.as_ptr() as *const u8);
            let d0 = f16_at(b0) * f16_at(core::ptr::from_ref(y0).cast::<u8>());
            let d1 = f16_at(b1) * f16_at(core::ptr::from_ref(y1).cast::<u8>());
            let s = match kind {
                Legacy::Q8_0 => {
                    let wq = load2x256(b0.add(2), b1.add(2));
                    let neg = _mm512_movepi8_mask(wq);
                    let sy = _mm512_mask_sub_epi8(ya, neg, zero, ya);
                    dot_u8i8::<VNNI>(_mm512_abs_epi8(wq), sy)
                }
                Legacy::Q4_0 | Legacy::Q5_0 => {
                    let (u, o) = if kind == Legacy::Q4_0 {
                        let u = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(nibbles32(b0.add(2))),
                            nibbles32(b1.add(2)),
                        );
                        (u, 8)
                    } else {
                        let h0 = (b0.add(2) as *const u32).read_unaligned() as u64;
                        let h1 = (b1.add(2) as *const u32).read_unaligned() as u64;
                        let hb = _mm512_and_si512(
                            _mm512_movm_epi8(h0 | (h1 << 32)),
                            _mm512_set1_epi8(0x10),
                        );
                        let u = _mm512_inserti64x4::<1>(
                            _mm512_castsi256_si512(nibbles32(b0.add(6))),
                            nibbles32(b1.add(6)),
                        );
                        (_mm512_or_si512(u, hb), 16)
                    };
                    let off = _mm512_set1_epi8(o);
                    if VNNI {
                        _mm512_sub_epi32(dot_u8i8::<true>(u, ya), dot_u8i8::<true>(off, ya))
                    } else {
                        let p16 = _mm512_sub_epi16(
                            _mm512_maddubs_epi16(u, ya),
                            _mm512_maddubs_epi16(off, ya),
                        );
                        _mm512_madd_epi16(p16, _mm512_set1_epi16(1))
                    }
                }
            };
            acc = _mm512_fmadd_ps(two_scales(d0, d1), _mm512_cvtepi32_ps(s), acc);
        }
        let mut r = hsum512(acc);
        if nb % 2 == 1 {
            let (wt, at) = (&w[(nb - 1) * bb..nb * bb], &a[nb - 1..nb]);
            r += match kind {
                Legacy::Q8_0 => avx2::dot_q8_0(wt, at),
                Legacy::Q4_0 => avx2::dot_q4_0(wt, at),
                Legacy::Q5_0 => avx2::dot_q5_0(wt, at),
            };
        }
        r
    }
}

#[inline(always)]
unsafe fn q4_1_body<const VNNI: bool>(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let nb = a.len().min(w.len() / 20);
    let pf = super::prefetch_distance();
    let pairs = nb / 2;
    // SAFETY: blocks 2p, 2p+1 < nb lie inside w and a; loads of 4 + 16 bytes.
    unsafe {
        let mut acc = _mm512_setzero_ps();
        let mut summs = 0f32;
        for p in 0..pairs {
            let b0 = w.as_ptr().add(2 * p * 20);
            avx2::prefetch(b0, pf, 2 * 20);
            let b1 = b0.add(20);
            let (y0, y1) = (a.get_unchecked(2 * p), a.get_unchecked(2 * p + 1));
            let ya = load2x256(y0.qs.as_ptr() as *const u8, y1.qs.as_ptr() as *const u8);
            let d0 = f16_at(b0) * f16_at(core::ptr::from_ref(y0).cast::<u8>());
            let d1 = f16_at(b1) * f16_at(core::ptr::from_ref(y1).cast::<u8>());
            summs += f16_at(b0.add(2)) * f16_at(core::ptr::from_ref(y0).cast::<u8>().add(2))
                + f16_at(b1.add(2)) * f16_at(core::ptr::from_ref(y1).cast::<u8>().add(2));
            let u = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(nibbles32(b0.add(4))),
                nibbles32(b1.add(4)),
            );
            let s = dot_u8i8::<VNNI>(u, ya);
            acc = _mm512_fmadd_ps(two_scales(d0, d1), _mm512_cvtepi32_ps(s), acc);
        }
        let mut r = hsum512(acc) + summs;
        if nb % 2 == 1 {
            r += avx2::dot_q4_1(&w[(nb - 1) * 20..nb * 20], &a[nb - 1..nb]);
        }
        r
    }
}

macro_rules! wrappers {
    ($feat:literal, $vnni:literal, $doc:literal) => {
        #[doc = concat!("Q4_K · Q8_K (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::k4_body::<false, $vnni>(w, a) }
        }
        #[doc = concat!("Q5_K · Q8_K (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::k4_body::<true, $vnni>(w, a) }
        }
        #[doc = concat!("Q6_K · Q8_K (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::q6k_body::<$vnni>(w, a) }
        }
        #[doc = concat!("Q8_0 · Q8_0 (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::legacy_body::<$vnni>(super::Legacy::Q8_0, w, a) }
        }
        #[doc = concat!("Q4_0 · Q8_0 (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::legacy_body::<$vnni>(super::Legacy::Q4_0, w, a) }
        }
        #[doc = concat!("Q5_0 · Q8_0 (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q5_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::legacy_body::<$vnni>(super::Legacy::Q5_0, w, a) }
        }
        #[doc = concat!("Q4_1 · Q8_1 (", $doc, ").\n\n# Safety\nThe CPU must support ", $feat, ".")]
        #[target_feature(enable = $feat)]
        pub unsafe fn dot_q4_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
            // SAFETY: features enabled on this function; bounds handled in the body.
            unsafe { super::q4_1_body::<$vnni>(w, a) }
        }
    };
}

/// AVX-512F/BW/VL kernels.
pub mod bw {
    use super::*;
    wrappers!(
        "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
        false,
        "AVX-512BW"
    );
}

/// AVX-512 VNNI kernels.
pub mod vnni {
    use super::*;
    wrappers!(
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
        true,
        "AVX-512 VNNI"
    );
}
