//! The AVX-512 VNNI kernels of [`super`] (one file per ISA, as `quantdot/` is).

use std::arch::x86_64::*;

use super::{
    K4_HI, Q_BYTE, Q_NIB1, Q_NIB2, QActs, S_D, S_DM, S_K4, S_K6, chunk_bytes, chunk_cols, prefetch,
    rec_bytes, sub_at, sub_cols, sub_head,
};

/// Both 64-byte vectors (rows 0-15, 16-31) of the quad record at `rec`.
#[inline(always)]
unsafe fn load<const Q: u8>(rec: *const u8) -> (__m512i, __m512i) {
    // SAFETY: the record holds rec_bytes(Q) bytes.
    unsafe {
        if Q == Q_BYTE {
            return (
                _mm512_loadu_si512(rec.cast()),
                _mm512_loadu_si512(rec.add(64).cast()),
            );
        }
        let nib = _mm512_set1_epi8(0x0F);
        let l = _mm512_loadu_si512(rec.cast());
        let mut w0 = _mm512_and_si512(l, nib);
        let mut w1 = _mm512_and_si512(_mm512_srli_epi16(l, 4), nib);
        if Q == Q_NIB1 {
            let k0 = (rec.add(64) as *const u64).read_unaligned();
            let k1 = (rec.add(72) as *const u64).read_unaligned();
            let b4 = _mm512_set1_epi8(0x10);
            w0 = _mm512_mask_add_epi8(w0, k0, w0, b4);
            w1 = _mm512_mask_add_epi8(w1, k1, w1, b4);
        } else if Q == Q_NIB2 {
            let h = _mm512_broadcast_i64x4(_mm256_loadu_si256(rec.add(64).cast()));
            let c0 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
            let c1 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
            let b45 = _mm512_set1_epi8(0x30);
            // w | (h_shifted & 0x30)
            w0 = _mm512_ternarylogic_epi32(w0, _mm512_sllv_epi16(h, c0), b45, 0xF8);
            w1 = _mm512_ternarylogic_epi32(w1, _mm512_srlv_epi16(h, c1), b45, 0xF8);
        }
        (w0, w1)
    }
}

/// A chunk's per-row `d` and `dmin` / `m` (zero where the format has none) at `base`, as
/// f32 (rows 0-15, 16-31).
#[inline(always)]
unsafe fn heads<const S: u8>(base: *const u8) -> ([__m512; 2], [__m512; 2]) {
    // SAFETY: the chunk starts with its head (64 or 128 bytes).
    unsafe {
        match S {
            S_K4 | S_DM => (f16x32(base), f16x32(base.add(64))),
            _ => (f16x32(base), [_mm512_setzero_ps(); 2]),
        }
    }
}

/// `(s, m)` of sub-block `j` of the chunk at `base` for rows 0-15, 16-31 (the products of
/// the scalar `scale_of`, bit for bit), from its head `(d, d2)`.
#[inline(always)]
unsafe fn scales<const Q: u8, const S: u8>(
    base: *const u8,
    j: usize,
    d: [__m512; 2],
    d2: [__m512; 2],
    mmul: f32,
) -> ([__m512; 2], [__m512; 2]) {
    // SAFETY: AVX-512F is available (every caller has it).
    let mul = |a: [__m512; 2], b: [__m512; 2]| unsafe {
        [_mm512_mul_ps(a[0], b[0]), _mm512_mul_ps(a[1], b[1])]
    };
    // SAFETY: sub-block j's scale bytes lie in the chunk.
    unsafe {
        match S {
            S_K4 => {
                let at = base.add(sub_at(Q, S, j));
                let cnt = _mm_cvtsi32_si128(2 * j as i32);
                let (m15, m30) = (_mm512_set1_epi32(15), _mm512_set1_epi32(0x30));
                let (mut sc, mut mn) = ([_mm512_setzero_ps(); 2], [_mm512_setzero_ps(); 2]);
                for h in 0..2 {
                    // [16] u8: sc & 15 | (mn & 15) << 4; [16] u32: the high bits.
                    let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(at.add(16 * h).cast()));
                    let hi = _mm512_loadu_si512(base.add(K4_HI + 64 * h).cast());
                    let hi = _mm512_srl_epi32(hi, cnt);
                    let s = _mm512_or_si512(
                        _mm512_and_si512(b, m15),
                        _mm512_and_si512(_mm512_slli_epi32(hi, 4), m30),
                    );
                    let m = _mm512_or_si512(
                        _mm512_srli_epi32(b, 4),
                        _mm512_and_si512(_mm512_srli_epi32(hi, 12), m30),
                    );
                    sc[h] = _mm512_cvtepi32_ps(s);
                    mn[h] = _mm512_cvtepi32_ps(m);
                }
                (mul(d, sc), mul(d2, mn))
            }
            S_K6 => {
                let v = mul(d, i8x32(base.add(sub_at(Q, S, j))));
                (v, mul([_mm512_set1_ps(32.0); 2], v))
            }
            S_D => (d, mul([_mm512_set1_ps(mmul); 2], d)),
            _ => {
                debug_assert_eq!(S, S_DM);
                let neg = |v: __m512| {
                    _mm512_castsi512_ps(_mm512_xor_si512(
                        _mm512_castps_si512(v),
                        _mm512_set1_epi32(i32::MIN),
                    ))
                };
                (d, [neg(d2[0]), neg(d2[1])])
            }
        }
    }
}

/// [`super::PackedMatrix::expand`] on AVX-512BW for a panel of format `(Q, S)`: each
/// record through [`load`], the scales through [`scales`].
///
/// # Safety
/// AVX-512F/BW are available; `panel` is a whole panel of format `(Q, S)` with `cols`
/// columns; `dst` holds `cols / 4 · 32` quads and `cols / sz · 32` scales and offsets.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn expand<const Q: u8, const S: u8>(
    panel: &[u8],
    cols: usize,
    mmul: f32,
    dst: &mut super::Panel,
) {
    let (cc, cb, sz) = (chunk_cols(S), chunk_bytes(Q, S), sub_cols(S));
    let (rb, sq, nsc) = (rec_bytes(Q), sz / 4, cc / sz);
    let (sp, mp) = (dst.s.as_mut_ptr(), dst.m.as_mut_ptr());
    let dq = dst.q.as_mut_ptr().cast::<u8>();
    for c in 0..cols / cc {
        // SAFETY (block): chunk c of the panel, its records and scales at the layout's
        // offsets; quads, scales and offsets of chunk c inside `dst` (caller).
        unsafe {
            let base = panel.as_ptr().add(c * cb);
            let (d, d2) = heads::<S>(base);
            for j in 0..nsc {
                let (s, m) = scales::<Q, S>(base, j, d, d2, mmul);
                let o = (c * nsc + j) * 32;
                for h in 0..2 {
                    _mm512_storeu_ps(sp.add(o + 16 * h), s[h]);
                    _mm512_storeu_ps(mp.add(o + 16 * h), m[h]);
                }
                for qd in 0..sq {
                    let rec = base.add(sub_at(Q, S, j) + sub_head(S) + qd * rb);
                    let (w0, w1) = load::<Q>(rec);
                    let out = dq.add(((c * nsc + j) * sq + qd) * 128);
                    _mm512_storeu_si512(out.cast(), w0);
                    _mm512_storeu_si512(out.add(64).cast(), w1);
                }
            }
        }
    }
}

/// `[32]` f16 at `p` as two f32 vectors.
#[inline(always)]
unsafe fn f16x32(p: *const u8) -> [__m512; 2] {
    // SAFETY: 64 bytes at p.
    unsafe {
        [
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast())),
        ]
    }
}

/// `[32]` i8 at `p` as two f32 vectors.
#[inline(always)]
unsafe fn i8x32(p: *const u8) -> [__m512; 2] {
    // SAFETY: 32 bytes at p.
    unsafe {
        let (a, b) = (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(16).cast()));
        [
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)),
        ]
    }
}

/// `N` tokens from `t0` times one packed panel (`cols` columns): the
/// [`super::PackedMatrix::micro_scalar`] arithmetic on AVX-512 VNNI.
///
/// # Safety
/// AVX-512F/BW/VNNI present; `panel` is a whole panel of format `(Q, S)`; tokens
/// `t0..t0 + N` lie in `x`; `out` holds `(N − 1) · stride + 32` values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    // The tokens' rows, checked once: quants, block scales, sub-block sums.
    assert_eq!(x.k, k, "packed micro-kernel: activations of another width");
    let (xq, xd, xs) = x.token_rows::<N>(t0, sz);
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    for c in 0..k / cc {
        // SAFETY: chunk c of the panel (k / cc chunks of cb bytes).
        let base = unsafe { panel.as_ptr().add(c * cb) };
        // SAFETY: the chunk starts with its head.
        let (d, d2) = unsafe { heads::<S>(base) };
        for j in 0..nsc {
            let b = c * nsc + j;
            let mut dot = [[_mm512_setzero_si512(); 2]; N];
            for qd in 0..sq {
                let kq = b * sq + qd;
                let rec = base.wrapping_add(sub_at(Q, S, j) + sub_head(S) + qd * rb);
                // SAFETY: record j · sq + qd of the chunk.
                let (w0, w1) = unsafe { load::<Q>(rec) };
                prefetch(rec, pf, rb);
                for (i, dd) in dot.iter_mut().enumerate() {
                    // SAFETY: column 4 kq + 3 < k of token t0 + i's row (asserted above).
                    let xv = unsafe { (xq[i].add(4 * kq) as *const i32).read_unaligned() };
                    let xb = _mm512_set1_epi32(xv);
                    dd[0] = _mm512_dpbusd_epi32(dd[0], w0, xb);
                    dd[1] = _mm512_dpbusd_epi32(dd[1], w1, xb);
                }
            }
            // SAFETY: sub-block j's scale bytes lie in the chunk.
            let (s, m) = unsafe { scales::<Q, S>(base, j, d, d2, mmul) };
            for (i, a) in acc.iter_mut().enumerate() {
                // SAFETY: b · sz / 32 < k / 32 and b < nsub within the token's rows (asserted).
                let (dx, xsum) = unsafe { (*xd[i].add(b * sz / 32), *xs[i].add(b)) };
                let (dx, xsum) = (_mm512_set1_ps(dx), _mm512_set1_ps(xsum));
                a[0] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][0]), _mm512_mul_ps(s[0], dx), a[0]);
                a[1] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][1]), _mm512_mul_ps(s[1], dx), a[1]);
                a[0] = _mm512_fnmadd_ps(m[0], xsum, a[0]);
                a[1] = _mm512_fnmadd_ps(m[1], xsum, a[1]);
            }
        }
    }
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: 32 values at i · stride inside `out`.
        unsafe {
            let o = out.add(i * stride);
            _mm512_storeu_ps(o, a[0]);
            _mm512_storeu_ps(o.add(16), a[1]);
        }
    }
}
