//! AVX2 + FMA + F16C body of [`super::attn_paged_f16_tiled`]: score micro-kernel (up to 4
//! query heads × 1 key, the per-token `dot_f16`'s two accumulators each), value micro-kernel
//! (up to 2 heads × 32 columns held in registers over all of a token's positions).

use core::arch::x86_64::*;

use crate::attn_decode::softmax;
use crate::attn_kv::{F32Rows, KvRows};
use crate::attn_paged::{PagedQuery, PagedShape};

/// Keys per score block: the block's K rows stay in L1 while every token of the tile meets
/// them.
const KEY_BLOCK: usize = 16;

/// Horizontal sum in the per-token kernel's order (`attn_decode::x86::hsum`: halves, then
/// pairs 0+2 / 1+3, then those two).
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only AVX ops in an AVX-enabled caller.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// `NR` dot products of query rows `q + r·hd` (f32, `hd` each) with the key row at element
/// `k` of `rows`, each computed exactly as `attn_decode::x86::dot_f16`.
///
/// # Safety
/// AVX2+FMA+F16C; `q` valid for `NR·hd` floats, the pool for `k..k + hd`.
#[inline(always)]
unsafe fn dots<const NR: usize, R: KvRows>(
    q: *const f32,
    hd: usize,
    rows: R,
    k: usize,
) -> [f32; NR] {
    let n8 = hd / 8 * 8;
    // SAFETY: every 8-wide access is at i..i+8 ≤ n8 ≤ hd within a row; the caller guarantees
    // the rows and the key row.
    unsafe {
        let mut a0 = [_mm256_setzero_ps(); NR];
        let mut a1 = [_mm256_setzero_ps(); NR];
        let mut i = 0;
        while i + 16 <= n8 {
            let k0 = rows.load8(k + i);
            let k1 = rows.load8(k + i + 8);
            for r in 0..NR {
                let qr = q.add(r * hd + i);
                a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), k0, a0[r]);
                a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr.add(8)), k1, a1[r]);
            }
            i += 16;
        }
        if i < n8 {
            let k0 = rows.load8(k + i);
            for (r, a) in a0.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(r * hd + i)), k0, *a);
            }
        }
        let mut s = [0f32; NR];
        for r in 0..NR {
            let mut x = hsum(_mm256_add_ps(a0[r], a1[r]));
            for j in n8..hd {
                x += *q.add(r * hd + j) * rows.get(k + j);
            }
            s[r] = x;
        }
        s
    }
}

/// `out_r[c..c + 8·NC] = Σ_p w_r[p] · v_p[c..]` for `NR` rows, positions in `slots` order,
/// from zero with one FMA per position (as `attn_decode::x86::axpy_f16` after `fill(0.0)`).
///
/// * `w`: row `r`'s weights at `w + r·w_stride`, one per entry of `slots`
/// * `slots`: offsets (elements) of the value rows in `v`
/// * `out`: row `r` at `out + r·hd`
///
/// # Safety
/// AVX2+FMA+F16C; every pointer valid for what it is read or written at.
#[inline(always)]
unsafe fn weighted_values<const NR: usize, const NC: usize, R: KvRows>(
    w: *const f32,
    w_stride: usize,
    slots: &[usize],
    v: R,
    c: usize,
    out: *mut f32,
    hd: usize,
) {
    // SAFETY: the caller guarantees the rows, the value rows (offset + c + 8·NC ≤ offset + hd)
    // and the output rows.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NC]; NR];
        for (i, &off) in slots.iter().enumerate() {
            let mut vv = [_mm256_setzero_ps(); NC];
            for (j, x) in vv.iter_mut().enumerate() {
                *x = v.load8(off + c + 8 * j);
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let wr = _mm256_set1_ps(*w.add(r * w_stride + i));
                for (x, &y) in a.iter_mut().zip(&vv) {
                    *x = _mm256_fmadd_ps(wr, y, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (j, &x) in a.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * hd + c + 8 * j), x);
            }
        }
    }
}

/// One tile (tokens `qs`, positions `lo..hi` covering theirs) against KV head `kvh`.
///
/// * `q`: the tokens' query rows `[qs.len(), n_head, head_dim]` f32
/// * `outs[t]`: token `t`'s output heads of `kvh`, `[group, head_dim]` f32
///
/// Pools whose rows cost several ops to widen ([`KvRows::WIDEN_TILES`]: q8_0) are widened
/// once per tile into an f32 scratch `[hi - lo, head_dim]` (exactly the values the loads give),
/// then the tile runs on it: the same arithmetic on the same values, so the same bits.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `shape.check` passed for these queries.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile<R: KvRows>(
    qs: &[PagedQuery<'_>],
    lo: usize,
    hi: usize,
    q: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    kvh: usize,
    outs: &mut [&mut [f32]],
) {
    let hd = shape.head_dim;
    let table = qs[0].table;
    // Offsets (elements) of positions lo..hi in the pools, KV head kvh.
    let slots: Vec<usize> = (lo..hi).map(|p| shape.offset(table, p, kvh)).collect();
    if R::WIDEN_TILES && hd.is_multiple_of(8) {
        let n = hi - lo;
        let (mut kf, mut vf) = (vec![0f32; n * hd], vec![0f32; n * hd]); // [n, hd] each
        for (i, &off) in slots.iter().enumerate() {
            for c in (0..hd).step_by(8) {
                // SAFETY: rows at `slots` lie in the pools (checked), c + 8 ≤ hd, and the
                // scratch rows hold hd floats at i·hd.
                unsafe {
                    _mm256_storeu_ps(kf.as_mut_ptr().add(i * hd + c), k.load8(off + c));
                    _mm256_storeu_ps(vf.as_mut_ptr().add(i * hd + c), v.load8(off + c));
                }
            }
        }
        let local: Vec<usize> = (0..n).map(|i| i * hd).collect();
        // SAFETY: forwarded; the scratch rows at `local` hold hd floats each.
        unsafe {
            tile_on(
                qs,
                lo,
                hi,
                q,
                F32Rows(&kf),
                F32Rows(&vf),
                &local,
                shape,
                kvh,
                outs,
            )
        };
        return;
    }
    // SAFETY: forwarded.
    unsafe { tile_on(qs, lo, hi, q, k, v, &slots, shape, kvh, outs) };
}

/// [`tile`] over rows at `slots` (element offsets of positions `lo..hi`) of `k` and `v`.
///
/// # Safety
/// As [`tile`]; every offset in `slots` starts a row of `head_dim` elements in the pools.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_on<R: KvRows>(
    qs: &[PagedQuery<'_>],
    lo: usize,
    hi: usize,
    q: &[f32],
    k: R,
    v: R,
    slots: &[usize],
    shape: PagedShape,
    kvh: usize,
    outs: &mut [&mut [f32]],
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let (width, span) = (shape.n_head * hd, group * hd);
    let n = hi - lo;
    let mut scores = vec![0f32; qs.len() * group * n]; // [tokens, group, n]
    // Q·Kᵀ: key blocks outer, so a block's rows serve every token of the tile from L1.
    for kb in (0..n).step_by(KEY_BLOCK) {
        let ke = (kb + KEY_BLOCK).min(n);
        for (t, pq) in qs.iter().enumerate() {
            let (a, b) = (kb.max(pq.lo - lo), ke.min(pq.hi - lo));
            let qg = &q[t * width + kvh * span..][..span];
            let mut g = 0;
            while g < group {
                let nr = (group - g).min(4);
                let qp = qg[g * hd..].as_ptr();
                let row = |i: usize| (t * group + g + i) * n;
                for p in a..b {
                    let kp = slots[p];
                    // SAFETY: rows g..g+nr of qg (nr·hd floats) and the key row at slots[p]
                    // (in the pool: `check` bounded every table entry) are in bounds.
                    let s: [f32; 4] = unsafe {
                        match nr {
                            4 => dots::<4, R>(qp, hd, k, kp),
                            3 => pad(dots::<3, R>(qp, hd, k, kp)),
                            2 => pad(dots::<2, R>(qp, hd, k, kp)),
                            _ => pad(dots::<1, R>(qp, hd, k, kp)),
                        }
                    };
                    for (i, &x) in s[..nr].iter().enumerate() {
                        scores[row(i) + p] = x * pq.scale;
                    }
                }
                g += nr;
            }
        }
    }
    for (t, pq) in qs.iter().enumerate() {
        for g in 0..group {
            softmax(
                true,
                &mut scores[(t * group + g) * n..][pq.lo - lo..pq.hi - lo],
            );
        }
    }
    // P·V: 32-column strips outer (a strip of every value row stays in L1 across tokens).
    let n8 = hd / 8 * 8;
    let mut c = 0;
    while c < n8 {
        let nc = ((n8 - c) / 8).min(4);
        for (t, pq) in qs.iter().enumerate() {
            let (a, b) = (pq.lo - lo, pq.hi - lo);
            let mut g = 0;
            while g < group {
                let nr = (group - g).min(2);
                let w = scores[(t * group + g) * n + a..].as_ptr();
                let o = outs[t][g * hd..].as_mut_ptr();
                let sl = &slots[a..b];
                let vp = v;
                // SAFETY: weights rows g..g+nr of token t span n each (a..b within); value
                // rows at `slots` hold hd ≥ c + 8·nc halves; output rows g..g+nr of outs[t].
                unsafe {
                    match (nr, nc) {
                        (2, 4) => weighted_values::<2, 4, R>(w, n, sl, vp, c, o, hd),
                        (2, 3) => weighted_values::<2, 3, R>(w, n, sl, vp, c, o, hd),
                        (2, 2) => weighted_values::<2, 2, R>(w, n, sl, vp, c, o, hd),
                        (2, _) => weighted_values::<2, 1, R>(w, n, sl, vp, c, o, hd),
                        (_, 4) => weighted_values::<1, 4, R>(w, n, sl, vp, c, o, hd),
                        (_, 3) => weighted_values::<1, 3, R>(w, n, sl, vp, c, o, hd),
                        (_, 2) => weighted_values::<1, 2, R>(w, n, sl, vp, c, o, hd),
                        (_, _) => weighted_values::<1, 1, R>(w, n, sl, vp, c, o, hd),
                    }
                }
                g += nr;
            }
        }
        c += nc * 8;
    }
    if n8 < hd {
        // Tail columns: the per-token kernel's scalar `out[j] += s * v[j]`, positions ascending.
        for (t, pq) in qs.iter().enumerate() {
            for g in 0..group {
                let o = &mut outs[t][g * hd..(g + 1) * hd];
                o[n8..].fill(0.0);
                let w = &scores[(t * group + g) * n..];
                for p in pq.lo - lo..pq.hi - lo {
                    for (j, x) in o.iter_mut().enumerate().skip(n8) {
                        *x += w[p] * v.get(slots[p] + j);
                    }
                }
            }
        }
    }
}

/// Widens a short score array to 4 (the unused lanes are never read).
#[inline(always)]
fn pad<const N: usize>(s: [f32; N]) -> [f32; 4] {
    let mut o = [0f32; 4];
    o[..N].copy_from_slice(&s);
    o
}
