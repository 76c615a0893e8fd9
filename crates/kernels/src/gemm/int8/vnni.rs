//! The AVX-512 VNNI kernels of [`super`] (one file per ISA, as `quantdot/` is), and its
//! AVX-512F/BW activation quantizer.

use std::arch::x86_64::*;

use super::{NT, Panel, QActs, ROWS};

/// [`super::micro_scalar`] for `N` tokens and `P` panels side by side (rows `r0..r0 + 32·P`)
/// on AVX-512 VNNI, `SQ` = S / 4 column quads per sub-block. With two panels each broadcast
/// activation quad serves four weight vectors instead of two (the broadcasts, not memory, bound
/// this kernel). Every output value gets the same operations in the same order whatever `N`
/// and `P`, so the same bits.
///
/// # Safety
/// AVX-512F/BW/VNNI must be present; tokens `t0..t0 + N` and rows `r0..r0 + 32·P` must lie
/// inside `x` and `out` (`[n_tokens, rows]`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn micro<const N: usize, const SQ: usize, const P: usize>(
    p: [&Panel; P],
    x: &QActs,
    t0: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let k = x.k;
    let sz = 4 * SQ;
    let nsub = k / sz;
    // The tokens' rows, checked once: quants, block scales, sub-block sums.
    let (xq, xd, xs) = x.token_rows::<N>(t0, sz);
    let pq: [*const u8; P] = std::array::from_fn(|h| p[h].q.as_ptr().cast::<u8>());
    let mut acc = [[[_mm512_setzero_ps(); 2]; P]; N]; // [token][panel][16 rows]
    for b in 0..nsub {
        let mut dot = [[[_mm512_setzero_si512(); 2]; P]; N];
        for qd in 0..SQ {
            let kq = b * SQ + qd;
            // SAFETY: kq < k / 4; each panel holds [k / 4][32][4] bytes.
            let w: [[__m512i; 2]; P] = std::array::from_fn(|h| unsafe {
                [
                    _mm512_loadu_si512(pq[h].add(kq * ROWS * 4).cast()),
                    _mm512_loadu_si512(pq[h].add(kq * ROWS * 4 + 64).cast()),
                ]
            });
            for (j, d) in dot.iter_mut().enumerate() {
                // SAFETY: column 4 kq + 3 < k of token t0 + j's row (asserted above).
                let xv = unsafe { (xq[j].add(4 * kq) as *const i32).read_unaligned() };
                let xb = _mm512_set1_epi32(xv);
                for (dh, wh) in d.iter_mut().zip(&w) {
                    dh[0] = _mm512_dpbusd_epi32(dh[0], wh[0], xb);
                    dh[1] = _mm512_dpbusd_epi32(dh[1], wh[1], xb);
                }
            }
        }
        for h in 0..P {
            // SAFETY: b < k / S; the scales are [k / S][32] f32.
            let (s0, s1, m0, m1) = unsafe {
                (
                    _mm512_loadu_ps(p[h].s.as_ptr().add(b * ROWS)),
                    _mm512_loadu_ps(p[h].s.as_ptr().add(b * ROWS + 16)),
                    _mm512_loadu_ps(p[h].m.as_ptr().add(b * ROWS)),
                    _mm512_loadu_ps(p[h].m.as_ptr().add(b * ROWS + 16)),
                )
            };
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: b · sz / 32 < k / 32 and b < nsub within the token's rows (asserted).
                let (dx, xsum) = unsafe { (*xd[j].add(b * sz / 32), *xs[j].add(b)) };
                let (dx, xsum) = (_mm512_set1_ps(dx), _mm512_set1_ps(xsum));
                let (d, a) = (dot[j][h], &mut a[h]);
                a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[0]), _mm512_mul_ps(s0, dx), a[0]);
                a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[1]), _mm512_mul_ps(s1, dx), a[1]);
                a[0] = _mm512_fnmadd_ps(m0, xsum, a[0]);
                a[1] = _mm512_fnmadd_ps(m1, xsum, a[1]);
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: rows r0 .. r0 + 32·P ≤ rows, token t0 + j < n_tokens.
        unsafe {
            let o = out.add((t0 + j) * rows + r0);
            for (h, ah) in a.iter().enumerate() {
                _mm512_storeu_ps(o.add(ROWS * h), ah[0]);
                _mm512_storeu_ps(o.add(ROWS * h + 16), ah[1]);
            }
        }
    }
}

/// Tokens `t0..t1` against `P` panels (rows `r0..r0 + 32·P`) in calls of up to [`NT`] tokens
/// for one panel, 3 for two (the most whose accumulators stay in the 32 registers).
///
/// # Safety
/// As [`micro`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tokens<const P: usize>(
    p: [&Panel; P],
    x: &QActs,
    sz: usize,
    t0: usize,
    t1: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let step = if P == 1 { NT } else { 3 };
    let mut t = t0;
    macro_rules! go {
        ($n:literal) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                if sz == 16 {
                    micro::<$n, 4, P>(p, x, t, out, r0, rows)
                } else {
                    micro::<$n, 8, P>(p, x, t, out, r0, rows)
                }
            }
        };
    }
    while t < t1 {
        let n = (t1 - t).min(step);
        match n {
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
        t += n;
    }
}
