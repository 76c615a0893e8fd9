//! AVX-512 body of [`super::attn_paged_f16_tiled`] (head sizes that are multiples of 16): the
//! tile's rows — (token, query head) pairs of one KV head, `[tokens, group]` — meet blocks of
//! key and value rows widened to f32 once per tile, in register-blocked micro-kernels:
//!
//! * Q·Kᵀ: 4 rows × 4 keys, one 16-lane accumulator per score (each exactly the per-token
//!   AVX2 dot product's two 8-lane chains side by side, as [`crate::attn_group`]), and the 16
//!   horizontal sums done together by a shuffle network that adds the same pairs in the same
//!   order as the per-token `hsum`;
//! * P·V: 4 rows × 64 columns held in registers over a block of positions, each output element
//!   accumulating `w·v` by one FMA per position in ascending order from zero, as the per-token
//!   `axpy`; rows of different tokens (GQA groups that are not a multiple of 4) run their own
//!   leading and trailing positions alone and the shared ones together, so every row still
//!   meets its positions in ascending order.
//!
//! The positions a row cannot see are never read, so the results are the per-token kernel's bit
//! for bit (addition is commutative in IEEE arithmetic; every pair summed is the same pair).

use core::arch::x86_64::*;

use super::TileScratch;
use crate::attn_decode::softmax_avx512;
use crate::attn_kv::KvRows;
use crate::attn_paged::{PagedQuery, PagedShape};

/// Rows per micro-kernel block.
const MR: usize = 4;
/// Keys per Q·Kᵀ micro-kernel step.
const NK: usize = 4;
/// Key rows widened per block of the Q·Kᵀ pass (16 KiB at head size 128: stays in L1 while
/// every row of the tile meets it).
const K_BLOCK: usize = 32;
/// Value rows widened per block of the P·V pass.
const V_BLOCK: usize = 64;

/// Whether the tile of `shape` runs here.
pub(super) fn supports(shape: &PagedShape) -> bool {
    shape.head_dim.is_multiple_of(16)
}

/// The 16 horizontal sums of `acc[4·key + row]` in the per-token `hsum` order
/// (`(lo256 + hi256)`, then 128-bit halves, then pairs 0+2 / 1+3, then those two): lane
/// `4·row + key` of the result.
///
/// # Safety
/// AVX-512F available.
#[inline(always)]
pub(crate) unsafe fn hsum16(a: &[__m512; 16]) -> __m512 {
    // SAFETY: register-only AVX-512F ops in an AVX-512F caller.
    unsafe {
        // x = lo8 + hi8 of each accumulator, two accumulators per register.
        let mut x = [_mm512_setzero_ps(); 8];
        for (m, x) in x.iter_mut().enumerate() {
            let (p, q) = (a[2 * m], a[2 * m + 1]);
            let lo = _mm512_shuffle_f32x4::<0x44>(p, q);
            let hi = _mm512_shuffle_f32x4::<0xEE>(p, q);
            *x = _mm512_add_ps(lo, hi);
        }
        // s4[i] = x[i] + x[i + 4]: one accumulator per 128-bit lane.
        let mut s = [_mm512_setzero_ps(); 4];
        for (k, s) in s.iter_mut().enumerate() {
            let (p, q) = (x[2 * k], x[2 * k + 1]);
            let lo = _mm512_shuffle_f32x4::<0x88>(p, q);
            let hi = _mm512_shuffle_f32x4::<0xDD>(p, q);
            *s = _mm512_add_ps(lo, hi);
        }
        // s2[j] = s4[j] + s4[j + 2], j < 2.
        let mut w = [_mm512_setzero_ps(); 2];
        for (k, w) in w.iter_mut().enumerate() {
            let (p, q) = (s[2 * k], s[2 * k + 1]);
            let lo = _mm512_shuffle_ps::<0x44>(p, q);
            let hi = _mm512_shuffle_ps::<0xEE>(p, q);
            *w = _mm512_add_ps(lo, hi);
        }
        // s2[0] + s2[1].
        let lo = _mm512_shuffle_ps::<0x88>(w[0], w[1]);
        let hi = _mm512_shuffle_ps::<0xDD>(w[0], w[1]);
        _mm512_add_ps(lo, hi)
    }
}

/// Scores of rows `q[r]` (f32, `hd` each) against 4 consecutive widened key rows at `kb`
/// (`[4, hd]`), scaled: lane `4·r + j` is row `r`, key `j`.
///
/// # Safety
/// AVX-512F; `hd % 16 == 0`, every pointer valid for what is read.
#[inline(always)]
unsafe fn scores_4x4(q: &[*const f32; MR], kb: *const f32, hd: usize, scale: f32) -> __m512 {
    // SAFETY: loads at c..c + 16 ≤ hd of each row.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 16]; // [key, row]
        let mut c = 0;
        while c < hd {
            let qv = [
                _mm512_loadu_ps(q[0].add(c)),
                _mm512_loadu_ps(q[1].add(c)),
                _mm512_loadu_ps(q[2].add(c)),
                _mm512_loadu_ps(q[3].add(c)),
            ];
            for j in 0..NK {
                let kv = _mm512_loadu_ps(kb.add(j * hd + c));
                for r in 0..MR {
                    acc[j * MR + r] = _mm512_fmadd_ps(qv[r], kv, acc[j * MR + r]);
                }
            }
            c += 16;
        }
        _mm512_mul_ps(hsum16(&acc), _mm512_set1_ps(scale))
    }
}

/// `o_r[c0..c0 + 16·NC] += Σ_p w_r[p] · v[p][c0..]` for `p` in `a..b` (ascending), `NR` rows.
///
/// * `w[r]`: row `r`'s weights, indexed by position within the block (`p`)
/// * `vb`: the widened value block `[V_BLOCK, hd]`, position `p` at `vb + p·hd`
/// * `o[r]`: row `r`'s output, read and written at `c0..c0 + 16·NC`
///
/// # Safety
/// AVX-512F; every pointer valid for what is read or written.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values<const NR: usize, const NC: usize>(
    w: &[*const f32; MR],
    o: &[*mut f32; MR],
    vb: *const f32,
    hd: usize,
    c0: usize,
    a: usize,
    b: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NC]; NR];
        for (r, acc) in acc.iter_mut().enumerate() {
            for (j, x) in acc.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(o[r].add(c0 + 16 * j));
            }
        }
        for p in a..b {
            let vr = vb.add(p * hd + c0);
            let mut vv = [_mm512_setzero_ps(); NC];
            for (j, x) in vv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(vr.add(16 * j));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let s = _mm512_set1_ps(*w[r].add(p));
                for (x, &y) in acc.iter_mut().zip(&vv) {
                    *x = _mm512_fmadd_ps(s, y, *x);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (j, &x) in acc.iter().enumerate() {
                _mm512_storeu_ps(o[r].add(c0 + 16 * j), x);
            }
        }
    }
}

/// [`values`] over every column of `hd` (64 at a time, then the 16-column tail).
///
/// # Safety
/// As [`values`].
#[inline(always)]
unsafe fn values_row<const NR: usize>(
    w: &[*const f32; MR],
    o: &[*mut f32; MR],
    vb: *const f32,
    hd: usize,
    a: usize,
    b: usize,
) {
    if a >= b {
        return;
    }
    let mut c0 = 0;
    // SAFETY: forwarded; c0 + 16·NC ≤ hd.
    unsafe {
        while c0 + 64 <= hd {
            values::<NR, 4>(w, o, vb, hd, c0, a, b);
            c0 += 64;
        }
        match (hd - c0) / 16 {
            3 => values::<NR, 3>(w, o, vb, hd, c0, a, b),
            2 => values::<NR, 2>(w, o, vb, hd, c0, a, b),
            1 => values::<NR, 1>(w, o, vb, hd, c0, a, b),
            _ => {}
        }
    }
}

/// `len` floats of `store` starting at a 64-byte boundary (grown as needed; what an earlier
/// tile left there is overwritten before it is read).
fn aligned(store: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if store.len() < len + 16 {
        store.clear();
        store.resize(len + 16, 0.0);
    }
    let skip = store.as_ptr().align_offset(64).min(16);
    &mut store[skip..skip + len]
}

/// Widens rows `p0..p1` (relative to the tile's `lo`) of `rows` at `slots` into `buf`
/// (`[p1 - p0, hd]`), zero-filling rows up to `pad` (a multiple of [`NK`] past `p1 - p0`).
///
/// # Safety
/// AVX-512F and F16C; `hd % 16 == 0`; the slots are rows of the pool; `buf` holds
/// `pad · hd` floats.
#[inline(always)]
unsafe fn widen<R: KvRows>(
    rows: R,
    slots: &[usize],
    p0: usize,
    p1: usize,
    pad: usize,
    buf: &mut [f32],
    hd: usize,
) {
    for (i, &off) in slots[p0..p1].iter().enumerate() {
        for c in (0..hd).step_by(16) {
            // SAFETY: a pool row of hd elements at `off` (checked); scratch row i holds hd.
            unsafe { _mm512_storeu_ps(buf.as_mut_ptr().add(i * hd + c), rows.load16(off + c)) };
        }
    }
    buf[(p1 - p0) * hd..pad * hd].fill(0.0);
}

/// One tile (tokens `qs`, positions `lo..hi` covering theirs) against KV head `kvh`.
///
/// * `q`: the tokens' query rows `[qs.len(), n_head, head_dim]` f32
/// * `outs[t]`: token `t`'s output heads of `kvh`, `[group, head_dim]` f32
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C; `shape.check` passed for these queries;
/// [`supports`] holds for `shape`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
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
    scratch: &mut TileScratch,
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let (width, span) = (shape.n_head * hd, group * hd);
    let table = qs[0].table;
    let scale = qs[0].scale;
    let n = hi - lo;
    let n_pad = n.div_ceil(NK) * NK;
    let n_rows = qs.len() * group;
    let TileScratch {
        q: q_store,
        rows: buf_store,
        scores: scores_store,
        slots,
    } = scratch;
    // Offsets (elements) of positions lo..hi in the pools, KV head kvh.
    slots.clear();
    slots.extend((lo..hi).map(|p| shape.offset(table, p, kvh)));
    let slots = &slots[..];
    // Row r = t·group + g of the tile (token t, query head g of kvh): its query, copied to
    // 64-byte alignment (a split 64-byte load costs two), and its visible positions (relative
    // to lo).
    let qa = aligned(q_store, n_rows * hd); // [n_rows, hd]
    for (t, rows) in qa.chunks_exact_mut(span).enumerate() {
        rows.copy_from_slice(&q[t * width + kvh * span..][..span]);
    }
    let q_row = |r: usize| qa[r * hd..].as_ptr();
    let range = |r: usize| {
        let pq = &qs[r / group];
        (pq.lo - lo, pq.hi - lo)
    };
    let scores = aligned(scores_store, n_rows * n_pad); // [n_rows, n_pad]
    let buf = aligned(buf_store, K_BLOCK.max(V_BLOCK) * hd); // [block, hd] widened rows

    // Q·Kᵀ: key blocks outer, so a block's widened rows serve every row of the tile from L1.
    for p0 in (0..n).step_by(K_BLOCK) {
        let p1 = (p0 + K_BLOCK).min(n);
        let pad = (p1 - p0).div_ceil(NK) * NK;
        // SAFETY: slots are pool rows (checked); buf holds K_BLOCK ≥ pad rows.
        unsafe { widen(k, slots, p0, p1, pad, buf, hd) };
        for r0 in (0..n_rows).step_by(MR) {
            let nr = (n_rows - r0).min(MR);
            // Missing rows repeat the last one (their scores are not stored).
            let rows: [usize; MR] = core::array::from_fn(|i| r0 + i.min(nr - 1));
            let (a, b) = rows.iter().fold((n, 0), |(a, b), &r| {
                let (ra, rb) = range(r);
                (a.min(ra), b.max(rb))
            });
            let (a, b) = (a.max(p0), b.min(p1));
            if a >= b {
                continue;
            }
            let qp = rows.map(q_row);
            // Keys in steps of 4 from the block start; the zero-padded rows past p1 (and
            // scores outside a row's range) are computed but never read.
            let mut j = p0 + (a - p0) / NK * NK;
            while j < b {
                // SAFETY: query rows of hd floats; scratch rows j - p0 .. + 4 ≤ pad.
                let s = unsafe { scores_4x4(&qp, buf.as_ptr().add((j - p0) * hd), hd, scale) };
                let dst = scores.as_mut_ptr();
                // SAFETY: row r0 + i < n_rows, columns j..j + 4 ≤ n_pad.
                unsafe {
                    let at = |i: usize| dst.add((r0 + i) * n_pad + j);
                    _mm_storeu_ps(at(0), _mm512_extractf32x4_ps::<0>(s));
                    if nr > 1 {
                        _mm_storeu_ps(at(1), _mm512_extractf32x4_ps::<1>(s));
                    }
                    if nr > 2 {
                        _mm_storeu_ps(at(2), _mm512_extractf32x4_ps::<2>(s));
                    }
                    if nr > 3 {
                        _mm_storeu_ps(at(3), _mm512_extractf32x4_ps::<3>(s));
                    }
                }
                j += NK;
            }
        }
    }
    for r in 0..n_rows {
        let (a, b) = range(r);
        // SAFETY: AVX-512F/AVX2/FMA/F16C (this function's features).
        unsafe { softmax_avx512(&mut scores[r * n_pad..][a..b]) };
    }

    // P·V: value blocks outer; the outputs accumulate from zero across the blocks.
    let mut o_rows: Vec<*mut f32> = Vec::with_capacity(n_rows); // row r's output
    for o in outs.iter_mut() {
        let o = &mut o[..span];
        o.fill(0.0);
        let base = o.as_mut_ptr();
        // SAFETY: g·hd < span: within the row.
        o_rows.extend((0..group).map(|g| unsafe { base.add(g * hd) }));
    }
    for p0 in (0..n).step_by(V_BLOCK) {
        let p1 = (p0 + V_BLOCK).min(n);
        // SAFETY: as for the keys.
        unsafe { widen(v, slots, p0, p1, p1 - p0, buf, hd) };
        // Block-relative positions index the widened rows (`buf + p·hd`) and, from each row's
        // `p0`, its weights.
        for r0 in (0..n_rows).step_by(MR) {
            let nr = (n_rows - r0).min(MR);
            let rr: [usize; MR] = core::array::from_fn(|i| r0 + i.min(nr - 1));
            let ranges = rr.map(|r| {
                let (a, b) = range(r);
                (a.clamp(p0, p1) - p0, b.clamp(p0, p1) - p0)
            });
            let w = rr.map(|r| scores[r * n_pad + p0..].as_ptr());
            let o = rr.map(|r| o_rows[r]);
            let vb = buf.as_ptr();
            // Positions every row sees, and each row's own before and after them.
            let (ca, cb) = ranges[..nr]
                .iter()
                .fold((0, usize::MAX), |(a, b), &(ra, rb)| (a.max(ra), b.min(rb)));
            // SAFETY: weights rows hold n_pad ≥ p1 - lo entries from p0; value rows in buf;
            // output rows of hd floats (distinct rows: nr rows are distinct).
            unsafe {
                if ca < cb {
                    for i in 0..nr {
                        let one = ([w[i]; MR], [o[i]; MR]);
                        values_row::<1>(&one.0, &one.1, vb, hd, ranges[i].0, ca);
                    }
                    match nr {
                        4 => values_row::<4>(&w, &o, vb, hd, ca, cb),
                        3 => values_row::<3>(&w, &o, vb, hd, ca, cb),
                        2 => values_row::<2>(&w, &o, vb, hd, ca, cb),
                        _ => values_row::<1>(&w, &o, vb, hd, ca, cb),
                    }
                    for i in 0..nr {
                        let one = ([w[i]; MR], [o[i]; MR]);
                        values_row::<1>(&one.0, &one.1, vb, hd, cb, ranges[i].1);
                    }
                } else {
                    for i in 0..nr {
                        let one = ([w[i]; MR], [o[i]; MR]);
                        values_row::<1>(&one.0, &one.1, vb, hd, ranges[i].0, ranges[i].1);
                    }
                }
            }
        }
    }
}
