//! The AVX-512 VNNI kernels of [`super`] (one file per ISA, as `quantdot/` is), and its
//! AVX-512F/BW activation quantizer.

use std::arch::x86_64::*;

use super::{NT, Panel, QActs, ROWS};

/// [`super::micro_scalar`] for `N` tokens on AVX-512 VNNI, `SQ` = S / 4 column quads per
/// sub-block.
///
/// # Safety
/// AVX-512F/BW/VNNI must be present; tokens `t0..t0 + N` and rows `r0..r0 + 32` must lie
/// inside `x` and `out` (`[n_tokens, rows]`).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    let pq = p.q.as_ptr().cast::<u8>();
    for b in 0..nsub {
        let mut dot = [[_mm512_setzero_si512(); 2]; N];
        for qd in 0..SQ {
            let kq = b * SQ + qd;
            // SAFETY: kq < k / 4; the panel holds [k / 4][32][4] bytes.
            let (w0, w1) = unsafe {
                (
                    _mm512_loadu_si512(pq.add(kq * ROWS * 4).cast()),
                    _mm512_loadu_si512(pq.add(kq * ROWS * 4 + 64).cast()),
                )
            };
            for (j, d) in dot.iter_mut().enumerate() {
                // SAFETY: token t0 + j < n_tokens, column 4 kq + 3 < k.
                let xv = unsafe {
                    (x.q.as_ptr().add((t0 + j) * k + 4 * kq) as *const i32).read_unaligned()
                };
                let xb = _mm512_set1_epi32(xv);
                d[0] = _mm512_dpbusd_epi32(d[0], w0, xb);
                d[1] = _mm512_dpbusd_epi32(d[1], w1, xb);
            }
        }
        // SAFETY: b < k / S; the scales are [k / S][32] f32.
        let (s0, s1, m0, m1) = unsafe {
            (
                _mm512_loadu_ps(p.s.as_ptr().add(b * ROWS)),
                _mm512_loadu_ps(p.s.as_ptr().add(b * ROWS + 16)),
                _mm512_loadu_ps(p.m.as_ptr().add(b * ROWS)),
                _mm512_loadu_ps(p.m.as_ptr().add(b * ROWS + 16)),
            )
        };
        for j in 0..N {
            let t = t0 + j;
            let dx = _mm512_set1_ps(x.d[t * (k / 32) + b * sz / 32]);
            let xs = _mm512_set1_ps(sums[t * nsub + b]);
            let a = &mut acc[j];
            a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[j][0]), _mm512_mul_ps(s0, dx), a[0]);
            a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[j][1]), _mm512_mul_ps(s1, dx), a[1]);
            a[0] = _mm512_fnmadd_ps(m0, xs, a[0]);
            a[1] = _mm512_fnmadd_ps(m1, xs, a[1]);
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: row r0 + 31 < rows, token t0 + j < n_tokens.
        unsafe {
            let o = out.add((t0 + j) * rows + r0);
            _mm512_storeu_ps(o, a[0]);
            _mm512_storeu_ps(o.add(16), a[1]);
        }
    }
}

/// Tokens `t0..t1` in calls of up to [`NT`].
///
/// # Safety
/// As [`micro`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
    macro_rules! go {
        ($n:literal) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                if sz == 16 {
                    micro::<$n, 4>(p, x, t, out, r0, rows)
                } else {
                    micro::<$n, 8>(p, x, t, out, r0, rows)
                }
            }
        };
    }
    while t < t1 {
        match (t1 - t).min(NT) {
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
        t += (t1 - t).min(NT);
    }
}
