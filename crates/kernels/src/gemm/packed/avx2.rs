//! The AVX2 kernels of [`super`] (one file per ISA, as `quantdot/` is).

use std::arch::x86_64::*;

use super::{
    K4_HI, Q_BYTE, Q_NIB1, Q_NIB2, QActs, S_D, S_DM, S_K4, S_K6, chunk_bytes, chunk_cols, prefetch,
    rec_bytes, sub_at, sub_cols, sub_head,
};

/// 32 bits at `p` as 32 bytes `0x10` (set) or 0.
#[inline(always)]
unsafe fn bits_to_b4(p: *const u8) -> __m256i {
    // SAFETY: 4 bytes at p; the caller runs with AVX2.
    unsafe {
        let bits = (p as *const i32).read_unaligned();
        let v = _mm256_set1_epi32(bits);
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let sel = _mm256_and_si256(_mm256_shuffle_epi8(v, idx), bit);
        _mm256_and_si256(_mm256_cmpeq_epi8(sel, bit), _mm256_set1_epi8(0x10))
    }
}

/// The two 32-byte vectors (rows `16 h .. 16 h + 8`, `+ 8 .. + 16`) of half `h` of the
/// quad record at `rec`.
#[inline(always)]
unsafe fn load<const Q: u8>(rec: *const u8, h: usize) -> (__m256i, __m256i) {
    // SAFETY: the record holds rec_bytes(Q) bytes.
    unsafe {
        if Q == Q_BYTE {
            return (
                _mm256_loadu_si256(rec.add(64 * h).cast()),
                _mm256_loadu_si256(rec.add(64 * h + 32).cast()),
            );
        }
        let nib = _mm256_set1_epi8(0x0F);
        let (mut l0, mut l1) = (
            _mm256_loadu_si256(rec.cast()),
            _mm256_loadu_si256(rec.add(32).cast()),
        );
        if h == 1 {
            l0 = _mm256_srli_epi16(l0, 4);
            l1 = _mm256_srli_epi16(l1, 4);
        }
        let (mut w0, mut w1) = (_mm256_and_si256(l0, nib), _mm256_and_si256(l1, nib));
        if Q == Q_NIB1 {
            w0 = _mm256_or_si256(w0, bits_to_b4(rec.add(64 + 8 * h)));
            w1 = _mm256_or_si256(w1, bits_to_b4(rec.add(64 + 8 * h + 4)));
        } else if Q == Q_NIB2 {
            let hb = _mm256_loadu_si256(rec.add(64).cast());
            let b45 = _mm256_set1_epi8(0x30);
            let (a, b) = if h == 0 {
                (_mm256_slli_epi16(hb, 4), _mm256_slli_epi16(hb, 2))
            } else {
                (hb, _mm256_srli_epi16(hb, 2))
            };
            w0 = _mm256_or_si256(w0, _mm256_and_si256(a, b45));
            w1 = _mm256_or_si256(w1, _mm256_and_si256(b, b45));
        }
        (w0, w1)
    }
}

/// `[16]` f16 at `p` as two f32 vectors.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> [__m256; 2] {
    // SAFETY: 32 bytes at p.
    unsafe {
        [
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
        ]
    }
}

/// `[16]` i8 at `p` as two f32 vectors.
#[inline(always)]
unsafe fn i8x16(p: *const u8) -> [__m256; 2] {
    // SAFETY: 16 bytes at p.
    unsafe {
        let (a, b) = (_mm_loadl_epi64(p.cast()), _mm_loadl_epi64(p.add(8).cast()));
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
        ]
    }
}

/// `(s, m)` of rows `16 h .. 16 h + 16` (two vectors each) for sub-block `j` of the chunk at
/// `base`.
///
/// # Safety
/// `base` is a whole chunk of format `(Q, S)`; AVX2 and F16C are present.
#[inline(always)]
unsafe fn scales16<const Q: u8, const S: u8>(
    base: *const u8,
    j: usize,
    h: usize,
    mmul: f32,
) -> ([__m256; 2], [__m256; 2]) {
    // SAFETY: the head and the sub-block's scales lie in the chunk.
    unsafe {
        let d = f16x16(base.add(32 * h));
        match S {
            S_K4 => {
                let d2 = f16x16(base.add(64 + 32 * h));
                let at = base.add(sub_at(Q, S, j) + 16 * h);
                let cnt = _mm_cvtsi32_si128(2 * j as i32);
                let (m15, m30) = (_mm256_set1_epi32(15), _mm256_set1_epi32(0x30));
                let (mut sc, mut mn) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2]);
                for e in 0..2 {
                    // [8] u8: sc & 15 | (mn & 15) << 4; [8] u32: the high bits.
                    let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.add(8 * e).cast()));
                    let hi = _mm256_loadu_si256(base.add(K4_HI + 64 * h + 32 * e).cast());
                    let hi = _mm256_srl_epi32(hi, cnt);
                    let s = _mm256_or_si256(
                        _mm256_and_si256(b, m15),
                        _mm256_and_si256(_mm256_slli_epi32(hi, 4), m30),
                    );
                    let m = _mm256_or_si256(
                        _mm256_srli_epi32(b, 4),
                        _mm256_and_si256(_mm256_srli_epi32(hi, 12), m30),
                    );
                    sc[e] = _mm256_cvtepi32_ps(s);
                    mn[e] = _mm256_cvtepi32_ps(m);
                }
                (
                    [_mm256_mul_ps(d[0], sc[0]), _mm256_mul_ps(d[1], sc[1])],
                    [_mm256_mul_ps(d2[0], mn[0]), _mm256_mul_ps(d2[1], mn[1])],
                )
            }
            S_K6 => {
                let sc = i8x16(base.add(sub_at(Q, S, j) + 16 * h));
                let v = [_mm256_mul_ps(d[0], sc[0]), _mm256_mul_ps(d[1], sc[1])];
                let c32 = _mm256_set1_ps(32.0);
                (v, [_mm256_mul_ps(c32, v[0]), _mm256_mul_ps(c32, v[1])])
            }
            S_D => {
                let mm = _mm256_set1_ps(mmul);
                (d, [_mm256_mul_ps(mm, d[0]), _mm256_mul_ps(mm, d[1])])
            }
            _ => {
                debug_assert_eq!(S, S_DM);
                let d2 = f16x16(base.add(64 + 32 * h));
                let sign = _mm256_set1_ps(-0.0);
                (d, [_mm256_xor_ps(d2[0], sign), _mm256_xor_ps(d2[1], sign)])
            }
        }
    }
}

/// [`super::vnni::micro`] on AVX2 + FMA + F16C: `vpmaddubsw` then `vpmaddwd` by ones, 16
/// rows per pass (quants ≤ 63 cannot saturate the i16 pair sums; Q8_0 is not offered here).
///
/// # Safety
/// As `vnni::micro`, with AVX2, FMA and F16C present.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn micro<const N: usize, const Q: u8, const S: u8>(
    panel: &[u8],
    cols: usize,
    mmul: f32,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    stride: usize,
    pf: usize,
) {
    let k = cols;
    let (cc, cb, sz) = (chunk_cols(S), chunk_bytes(Q, S), sub_cols(S));
    let (rb, sq, nsc) = (rec_bytes(Q), sz / 4, cc / sz);
    let nsub = k / sz;
    let sums = x.sums(sz);
    let xq = x.q.as_ptr();
    let ones = _mm256_set1_epi16(1);
    // One token: both 16-row halves in one pass over the panel (the panel is streamed
    // from DRAM once, and the second half does not wait for the first). More tokens: a
    // pass per half, as their accumulators would not fit the 16 registers together.
    let hs = if N == 1 { 2 } else { 1 };
    for h0 in (0..2).step_by(hs) {
        let mut acc = [[[_mm256_setzero_ps(); 2]; 2]; N];
        for c in 0..k / cc {
            // SAFETY: chunk c of the panel.
            let base = unsafe { panel.as_ptr().add(c * cb) };
            for j in 0..nsc {
                let b = c * nsc + j;
                let mut dot = [[[_mm256_setzero_si256(); 2]; 2]; N];
                for qd in 0..sq {
                    let kq = b * sq + qd;
                    let rec = base.wrapping_add(sub_at(Q, S, j) + sub_head(S) + qd * rb);
                    if h0 == 0 {
                        prefetch(rec, pf, rb);
                    }
                    for hh in 0..hs {
                        // SAFETY: record j · sq + qd of the chunk.
                        let (w0, w1) = unsafe { load::<Q>(rec, h0 + hh) };
                        for (i, dt) in dot.iter_mut().enumerate() {
                            // SAFETY: token t0 + i < n_tokens, column 4 kq + 3 < k.
                            let xv = unsafe {
                                (xq.add((t0 + i) * k + 4 * kq) as *const i32).read_unaligned()
                            };
                            let xb = _mm256_set1_epi32(xv);
                            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, xb), ones);
                            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, xb), ones);
                            let dd = &mut dt[hh];
                            dd[0] = _mm256_add_epi32(dd[0], p0);
                            dd[1] = _mm256_add_epi32(dd[1], p1);
                        }
                    }
                }
                for hh in 0..hs {
                    // SAFETY: the chunk's head and sub-block j's scales, rows 16 h..
                    let (s, m) = unsafe { scales16::<Q, S>(base, j, h0 + hh, mmul) };
                    for (i, at) in acc.iter_mut().enumerate() {
                        let t = t0 + i;
                        let dx = _mm256_set1_ps(x.d[t * (k / 32) + b * sz / 32]);
                        let xs = _mm256_set1_ps(sums[t * nsub + b]);
                        let (a, dd) = (&mut at[hh], &dot[i][hh]);
                        a[0] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(dd[0]),
                            _mm256_mul_ps(s[0], dx),
                            a[0],
                        );
                        a[1] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(dd[1]),
                            _mm256_mul_ps(s[1], dx),
                            a[1],
                        );
                        a[0] = _mm256_fnmadd_ps(m[0], xs, a[0]);
                        a[1] = _mm256_fnmadd_ps(m[1], xs, a[1]);
                    }
                }
            }
        }
        for (i, at) in acc.iter().enumerate() {
            for (hh, a) in at.iter().enumerate().take(hs) {
                // SAFETY: rows 16 h .. 16 h + 16 of token i inside `out`.
                unsafe {
                    let o = out.add(i * stride + 16 * (h0 + hh));
                    _mm256_storeu_ps(o, a[0]);
                    _mm256_storeu_ps(o.add(8), a[1]);
                }
            }
        }
    }
}
