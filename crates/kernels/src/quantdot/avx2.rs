//! AVX2 (+FMA, F16C) dot products built on `vpmaddubsw` (u8 × i8 → i16 pairs)
//! and `vpmaddwd` (i16 × i16 → i32 pairs, applying integer sub-block scales).
//!
//! Every function: `w` = one weight row of whole blocks, `a` = the matching
//! activation blocks; the shorter operand bounds the work, so all loads stay in
//! bounds. Callers must make sure the CPU has AVX2, FMA and F16C.

use core::arch::x86_64::*;

use super::{BlockQ8_0, BlockQ8_1, BlockQ8K};

/// Byte-shuffle masks broadcasting i16 lane `k` (of 8) to all 16 lanes.
static SHUF_I16: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut i = 0;
        while i < 16 {
            t[k][2 * i] = 2 * k as u8;
            t[k][2 * i + 1] = 2 * k as u8 + 1;
            i += 1;
        }
        k += 1;
    }
    t
};

/// Byte-shuffle masks for Q6_K: low 128-bit lane gets i16 `2i`, high lane `2i + 1`.
static SHUF_Q6: [[u8; 32]; 4] = {
    let mut t = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut i = 0;
        while i < 8 {
            t[k][2 * i] = 4 * k as u8;
            t[k][2 * i + 1] = 4 * k as u8 + 1;
            t[k][16 + 2 * i] = 4 * k as u8 + 2;
            t[k][16 + 2 * i + 1] = 4 * k as u8 + 3;
            i += 1;
        }
        k += 1;
    }
    t
};

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Four f16 at `p..p + 8` (unaligned) to f32 via F16C, as one full-register
/// `vcvtph2ps xmm, m64`. Written as inline asm because LLVM otherwise narrows
/// the load to a 16-bit insert into an arbitrary live register (seen: the
/// accumulator), creating a false dependency that serializes the loop.
#[inline(always)]
unsafe fn f16x4_at(p: *const u8) -> __m128 {
    let out: __m128;
    // SAFETY: caller guarantees 8 readable bytes at `p` and F16C; the asm only
    // reads that memory and writes `out`.
    unsafe {
        core::arch::asm!(
            "vcvtph2ps {o}, qword ptr [{p}]",
            p = in(reg) p,
            o = out(xmm_reg) out,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    out
}

/// f16 at `p` (unaligned) to f32; reads the 8 bytes `p..p + 8`.
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 8 readable bytes at `p` and F16C.
    unsafe { _mm_cvtss_f32(f16x4_at(p)) }
}

/// f16 at `p` to f32, reading the 8 bytes `p - 6..p + 2` (for a field at the
/// end of a block).
#[inline(always)]
pub(super) unsafe fn f16_at_end(p: *const u8) -> f32 {
    // SAFETY: caller guarantees readable bytes p-6..p+2 and F16C.
    unsafe {
        let v = f16x4_at(p.sub(6));
        _mm_cvtss_f32(_mm_shuffle_ps::<3>(v, v))
    }
}

/// Prefetches the `len` bytes starting `dist` bytes past `p` into L1, one
/// line at a time (no-op when `dist == 0`). Prefetches never fault, and the
/// address is formed with wrapping arithmetic, so any `p` is fine.
#[inline(always)]
pub(super) unsafe fn prefetch(p: *const u8, dist: usize, len: usize) {
    if dist == 0 {
        return;
    }
    let mut off = 0;
    while off < len {
        // SAFETY: a prefetch is only a hint; it never faults or reads into
        // the program's state.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(dist + off) as *const i8) };
        off += 64;
    }
}

/// Horizontal sum of 8 f32.
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: register-only AVX ops; caller guarantees AVX.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        hsum_ps128(s)
    }
}

#[inline(always)]
pub(super) unsafe fn hsum_ps128(s: __m128) -> f32 {
    // SAFETY: register-only SSE3 ops; caller guarantees AVX.
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The 12-byte K-quant scale field at `p` as 16 u8: scales in bytes 0..8,
/// mins in 8..16 (ggml's `get_scale_min_k4` for j = 0..8), unpacked in SIMD
/// registers. Reads 16 bytes (`p..p + 16`).
#[inline(always)]
pub(super) unsafe fn scales_mins_k4(p: *const u8) -> __m128i {
    // SAFETY: caller guarantees 16 readable bytes at `p` and AVX2.
    unsafe {
        // u32 lanes: [u0, u1, u2, -] = bytes [0..4, 4..8, 8..12, 12..16].
        let v = _mm_loadu_si128(p as *const __m128i);
        let low6 = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f)); // [sc 0..4, m 0..4]
        let top2 = _mm_slli_epi32::<4>(_mm_and_si128(
            _mm_srli_epi32::<6>(v),
            _mm_set1_epi32(0x0303_0303),
        ));
        let u2 = _mm_shuffle_epi32::<0b1010_1010>(v);
        let nib = _mm_and_si128(
            _mm_srlv_epi32(u2, _mm_set_epi32(0, 0, 4, 0)),
            _mm_set1_epi32(0x0f0f_0f0f),
        );
        let high = _mm_or_si128(nib, top2); // [sc 4..8, m 4..8]
        _mm_unpacklo_epi32(low6, high)
    }
}

/// Shared body of Q4_K / Q5_K (`FIVE` selects the high-bit plane).
#[inline(always)]
unsafe fn dot_k4<const FIVE: bool>(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let bb = if FIVE { 176 } else { 144 };
    let nb = a.len().min(w.len() / bb);
    let pf = super::prefetch_distance();
    // SAFETY: block i spans w[i*bb..(i+1)*bb] with i < nb ≤ w.len()/bb; all
    // loads below stay inside that block or inside `a[i]`. CPU features are
    // the caller's contract.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m1 = _mm256_set1_epi8(0x01);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(i * bb);
            prefetch(b, pf, bb);
            let y = a.get_unchecked(i);
            let d = y.d * f16_at(b);
            let dmin = -y.d * f16_at(b.add(2));
            let sm = _mm256_cvtepu8_epi16(scales_mins_k4(b.add(4)));
            // Mins: Σ_j m_j · (bsum_2j + bsum_2j+1).
            let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let bs8 = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs),
                _mm256_extracti128_si256::<1>(bs),
            );
            let pm = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), bs8);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(pm), acc_m);
            let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
            let (qs, mut hb) = if FIVE {
                (b.add(48), load(b.add(16)))
            } else {
                (b.add(16), _mm256_setzero_si256())
            };
            let q8 = y.qs.as_ptr() as *const u8;
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let sl = _mm256_shuffle_epi8(scales, load(SHUF_I16[2 * j].as_ptr()));
                let sh = _mm256_shuffle_epi8(scales, load(SHUF_I16[2 * j + 1].as_ptr()));
                let q4 = load(qs.add(32 * j));
                let mut ql = _mm256_and_si256(q4, m4);
                let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
                if FIVE {
                    let hl = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, m1));
                    let hh =
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<1>(hb), m1));
                    ql = _mm256_or_si256(ql, hl);
                    qh = _mm256_or_si256(qh, hh);
                    hb = _mm256_srli_epi16::<2>(hb);
                }
                let pl = _mm256_maddubs_epi16(ql, load(q8.add(64 * j)));
                let ph = _mm256_maddubs_epi16(qh, load(q8.add(64 * j + 32)));
                let pl = _mm256_madd_epi16(sl, pl);
                let ph = _mm256_madd_epi16(sh, ph);
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc) + hsum_ps128(acc_m)
    }
}

/// Q4_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    // SAFETY: features enabled on this function; bounds handled in dot_k4.
    unsafe { dot_k4::<false>(w, a) }
}

/// Q5_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    // SAFETY: features enabled on this function; bounds handled in dot_k4.
    unsafe { dot_k4::<true>(w, a) }
}

/// Q6_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let nb = a.len().min(w.len() / 210);
    let pf = super::prefetch_distance();
    // SAFETY: block i spans w[i*210..(i+1)*210], i < nb; every load is inside
    // it (ql 0..128, qh 128..192, scales 192..208, d 208..210) or inside a[i].
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(0x03);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(i * 210);
            prefetch(b, pf, 210);
            let y = a.get_unchecked(i);
            let d = y.d * f16_at_end(b.add(208));
            let q8 = y.qs.as_ptr() as *const u8;
            // -32 offset folded in through the activation block sums.
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
            let bs = _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i);
            let mut sumi = _mm256_sub_epi32(
                _mm256_setzero_si256(),
                _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs)),
            );
            for n in 0..2 {
                let sc = _mm_cvtepi8_epi16(_mm_loadl_epi64(b.add(192 + 8 * n) as *const __m128i));
                let sc = _mm256_broadcastsi128_si256(sc);
                let l1 = load(b.add(64 * n));
                let l2 = load(b.add(64 * n + 32));
                let hb = load(b.add(128 + 32 * n));
                let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, m3));
                let h1 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(hb), m3));
                let h2 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(hb), m3));
                let h3 = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(hb), m3));
                let q = [
                    _mm256_or_si256(_mm256_and_si256(l1, m4), h0),
                    _mm256_or_si256(_mm256_and_si256(l2, m4), h1),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4), h2),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l2), m4), h3),
                ];
                for (k, qk) in q.iter().enumerate() {
                    let p = _mm256_maddubs_epi16(*qk, load(q8.add(128 * n + 32 * k)));
                    let s = _mm256_shuffle_epi8(sc, load(SHUF_Q6[k].as_ptr()));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// 16 packed nibbles at `p` → 32 bytes (low nibbles first, then high).
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 16 readable bytes at `p` and AVX2.
    unsafe {
        let x = _mm_loadu_si128(p as *const __m128i);
        let v = _mm256_set_m128i(_mm_srli_epi16::<4>(x), x);
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }
}

/// Bit `j` of `x` → byte `j` = 0xFF or 0x00.
#[inline(always)]
pub(super) unsafe fn bytes_from_bits32(x: u32) -> __m256i {
    // SAFETY: register-only AVX2 ops; caller guarantees AVX2.
    unsafe {
        let t = _mm256_set1_epi32(x as i32);
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(t, shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}

/// Σ x·y over 32 signed bytes, as 8 i32 (sign trick; exact for x ≠ -128 or y ≠ -128).
#[inline(always)]
unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 ops.
    unsafe {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }
}

/// Q8_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let nb = a.len().min(w.len() / 34);
    let pf = super::prefetch_distance();
    // SAFETY: block i = w[i*34..(i+1)*34], i < nb; loads of 2 + 32 bytes.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (i, y) in a[..nb].iter().enumerate() {
            let b = w.as_ptr().add(i * 34);
            prefetch(b, pf, 34);
            let d = f16_at(b) * f16_at(core::ptr::from_ref(y).cast::<u8>());
            let p = dot_i8(load(b.add(2)), load(y.qs.as_ptr() as *const u8));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        }
        hsum_ps(acc)
    }
}

/// Q4_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let nb = a.len().min(w.len() / 18);
    let pf = super::prefetch_distance();
    // SAFETY: block i = w[i*18..(i+1)*18], i < nb; loads of 2 + 16 bytes.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let off = _mm256_set1_epi8(8);
        for (i, y) in a[..nb].iter().enumerate() {
            let b = w.as_ptr().add(i * 18);
            prefetch(b, pf, 18);
            let d = f16_at(b) * f16_at(core::ptr::from_ref(y).cast::<u8>());
            let q = _mm256_sub_epi8(nibbles32(b.add(2)), off);
            let p = dot_i8(q, load(y.qs.as_ptr() as *const u8));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        }
        hsum_ps(acc)
    }
}

/// Q4_1 · Q8_1.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let nb = a.len().min(w.len() / 20);
    let pf = super::prefetch_distance();
    // SAFETY: block i = w[i*20..(i+1)*20], i < nb; loads of 4 + 16 bytes.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        let ones = _mm256_set1_epi16(1);
        for (i, y) in a[..nb].iter().enumerate() {
            let b = w.as_ptr().add(i * 20);
            prefetch(b, pf, 20);
            let d = f16_at(b) * f16_at(core::ptr::from_ref(y).cast::<u8>());
            summs += f16_at(b.add(2)) * f16_at(core::ptr::from_ref(y).cast::<u8>().add(2));
            let q = nibbles32(b.add(4));
            let p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(q, load(y.qs.as_ptr() as *const u8)),
                ones,
            );
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        }
        hsum_ps(acc) + summs
    }
}

/// Q5_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let nb = a.len().min(w.len() / 22);
    let pf = super::prefetch_distance();
    // SAFETY: block i = w[i*22..(i+1)*22], i < nb; loads of 2 + 4 + 16 bytes.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let hi = _mm256_set1_epi8(0xF0u8 as i8);
        for (i, y) in a[..nb].iter().enumerate() {
            let b = w.as_ptr().add(i * 22);
            prefetch(b, pf, 22);
            let d = f16_at(b) * f16_at(core::ptr::from_ref(y).cast::<u8>());
            let qh = (b.add(2) as *const u32).read_unaligned();
            // q | 0xF0 == q - 16 (mod 256) where the 5th bit is clear.
            let bxhi = _mm256_andnot_si256(bytes_from_bits32(qh), hi);
            let q = _mm256_or_si256(nibbles32(b.add(6)), bxhi);
            let p = dot_i8(q, load(y.qs.as_ptr() as *const u8));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
        }
        hsum_ps(acc)
    }
}

/// Horizontal sum of 8 i32.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: register-only AVX2 ops.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// Packs 4 × 8 i32 (already in i8 range) into 32 i8 in element order.
#[inline(always)]
unsafe fn pack_i8(q: [__m256i; 4]) -> __m256i {
    // SAFETY: register-only AVX2 ops.
    unsafe {
        let a = _mm256_packs_epi32(q[0], q[1]);
        let b = _mm256_packs_epi32(q[2], q[3]);
        let p = _mm256_packs_epi16(a, b);
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// Max |x| over 8-float chunks (NaNs ignored, like the scalar `>` scan).
#[inline(always)]
unsafe fn amax_ps(x: &[f32]) -> f32 {
    // SAFETY: 8-wide loads at i..i+8 ≤ x.len() (callers pass multiples of 8).
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= x.len() {
            let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(i)));
            m = _mm256_max_ps(a, m); // returns `m` when `a` is NaN
            i += 8;
        }
        let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_max_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// Q8_K quantization of whole blocks (`x`: `[out.len() * 256]`), bit-identical
/// to the scalar reference for finite inputs.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(256).zip(out.iter_mut()) {
        // SAFETY: all loads read xb[8i..8i+8] with 8i + 8 ≤ 256; the 32-byte
        // stores write yb.qs[32g..32g+32] with 32g + 32 ≤ 256.
        unsafe {
            let amax = amax_ps(xb);
            if amax == 0.0 {
                *yb = BlockQ8K::ZERO;
                continue;
            }
            // The first element reaching amax decides the sign, as in ggml.
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            let iv = _mm256_set1_ps(iscale);
            let top = _mm256_set1_epi32(127);
            for g in 0..8 {
                let mut q = [_mm256_setzero_si256(); 4];
                for (j, qj) in q.iter_mut().enumerate() {
                    let v = _mm256_loadu_ps(xb.as_ptr().add(32 * g + 8 * j));
                    // cvtps rounds half to even, like ggml's nearest_int.
                    *qj = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(iv, v)), top);
                }
                yb.bsums[2 * g] = hsum_i32(_mm256_add_epi32(q[0], q[1])) as i16;
                yb.bsums[2 * g + 1] = hsum_i32(_mm256_add_epi32(q[2], q[3])) as i16;
                _mm256_storeu_si256(yb.qs.as_mut_ptr().add(32 * g) as *mut __m256i, pack_i8(q));
            }
            yb.d = 1.0 / iscale;
        }
    }
}

/// Q8_0 / Q8_1 quantization of whole 32-blocks, bit-identical to the scalar
/// reference (`roundf`, ties away from zero) for finite inputs. Returns
/// `(d_bits, sum_bits, qs)` per block through `emit`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_32(x: &[f32], mut emit: impl FnMut(usize, u16, u16, &[i8; 32])) {
    for (bi, xb) in x.chunks_exact(32).enumerate() {
        // SAFETY: loads read xb[8j..8j+8], 8j + 8 ≤ 32; the store writes the
        // 32-byte local array.
        unsafe {
            let amax = amax_ps(xb);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let idv = _mm256_set1_ps(id);
            let half = _mm256_set1_ps(0.5);
            let sign = _mm256_set1_ps(-0.0);
            let one = _mm256_set1_ps(1.0);
            let mut q = [_mm256_setzero_si256(); 4];
            for (j, qj) in q.iter_mut().enumerate() {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xb.as_ptr().add(8 * j)), idv);
                // roundf: truncate, then step away from zero when |frac| >= 0.5.
                let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
                let step = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half),
                    _mm256_or_ps(one, _mm256_and_ps(v, sign)),
                );
                *qj = _mm256_cvttps_epi32(_mm256_add_ps(t, step));
            }
            let sum = hsum_i32(_mm256_add_epi32(
                _mm256_add_epi32(q[0], q[1]),
                _mm256_add_epi32(q[2], q[3]),
            ));
            let mut qs = [0i8; 32];
            _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, pack_i8(q));
            let d16 = _mm_extract_epi16::<0>(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(
                _mm_set_ss(d),
            )) as u16;
            let s16 = _mm_extract_epi16::<0>(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(
                _mm_set_ss(sum as f32 * d),
            )) as u16;
            emit(bi, d16, s16, &qs);
        }
    }
}
