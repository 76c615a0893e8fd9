//! The AVX2 kernels of [`super`] (one file per ISA, as `quantdot/` is).

use std::arch::x86_64::*;

use super::{Panel, QActs, ROWS};

/// [`super::micro_scalar`] for `N` (1 or 2) tokens on AVX2: `vpmaddubsw` (u8 × i8 → i16
/// pairs) then `vpmaddwd` by ones (→ i32), 16 rows (`half` of the panel) per pass. The i16
/// pair sums cannot saturate for quants ≤ 63 (Q6_K and below; Q8_0's biased 255 could, so
/// it is not offered on this path).
///
/// # Safety
/// AVX2 must be present; tokens `t0..t0 + N` and rows `r0..r0 + 32` inside `x` and `out`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro<const N: usize, const SQ: usize>(
    p: &Panel,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let k = x.k;
    let sz = 4 * SQ;
    let nsub = k / sz;
    let sums = x.sums(sz);
    let ones = _mm256_set1_epi16(1);
    let pq = p.q.as_ptr().cast::<u8>();
    for half in 0..2 {
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for b in 0..nsub {
            let mut dot = [[_mm256_setzero_si256(); 2]; N];
            for qd in 0..SQ {
                let kq = b * SQ + qd;
                let at = kq * ROWS * 4 + half * 64;
                // SAFETY: kq < k / 4; the panel holds [k / 4][32][4] bytes.
                let (w0, w1) = unsafe {
                    (
                        _mm256_loadu_si256(pq.add(at).cast()),
                        _mm256_loadu_si256(pq.add(at + 32).cast()),
                    )
                };
                for (j, d) in dot.iter_mut().enumerate() {
                    // SAFETY: token t0 + j < n_tokens, column 4 kq + 3 < k.
                    let xv = unsafe {
                        (x.q.as_ptr().add((t0 + j) * k + 4 * kq) as *const i32).read_unaligned()
                    };
                    let xb = _mm256_set1_epi32(xv);
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, xb), ones);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, xb), ones);
                    d[0] = _mm256_add_epi32(d[0], p0);
                    d[1] = _mm256_add_epi32(d[1], p1);
                }
            }
            let o = b * ROWS + half * 16;
            // SAFETY: b < k / S; the scales are [k / S][32] f32.
            let (s0, s1, m0, m1) = unsafe {
                (
                    _mm256_loadu_ps(p.s.as_ptr().add(o)),
                    _mm256_loadu_ps(p.s.as_ptr().add(o + 8)),
                    _mm256_loadu_ps(p.m.as_ptr().add(o)),
                    _mm256_loadu_ps(p.m.as_ptr().add(o + 8)),
                )
            };
            for j in 0..N {
                let t = t0 + j;
                let dx = _mm256_set1_ps(x.d[t * (k / 32) + b * sz / 32]);
                let xs = _mm256_set1_ps(sums[t * nsub + b]);
                let a = &mut acc[j];
                a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j][0]), _mm256_mul_ps(s0, dx), a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j][1]), _mm256_mul_ps(s1, dx), a[1]);
                a[0] = _mm256_fnmadd_ps(m0, xs, a[0]);
                a[1] = _mm256_fnmadd_ps(m1, xs, a[1]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: row r0 + 31 < rows, token t0 + j < n_tokens.
            unsafe {
                let o = out.add((t0 + j) * rows + r0 + half * 16);
                _mm256_storeu_ps(o, a[0]);
                _mm256_storeu_ps(o.add(8), a[1]);
            }
        }
    }
}

/// Tokens `t0..t1` in calls of up to 2.
///
/// # Safety
/// As [`micro`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tokens(
    p: &Panel,
    x: &QActs,
    sz: usize,
    t0: usize,
    t1: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let mut t = t0;
    while t < t1 {
        let n = (t1 - t).min(2);
        // SAFETY: forwarded from the caller.
        unsafe {
            match (n, sz) {
                (2, 16) => micro::<2, 4>(p, x, t, out, r0, rows),
                (2, _) => micro::<2, 8>(p, x, t, out, r0, rows),
                (_, 16) => micro::<1, 4>(p, x, t, out, r0, rows),
                _ => micro::<1, 8>(p, x, t, out, r0, rows),
            }
        }
        t += n;
    }
}
