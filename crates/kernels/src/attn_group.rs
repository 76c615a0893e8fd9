//! Paged attention with a GQA group's query heads computed together (issue 26: decode steps of
//! many sequences spend most of their time here): each key and value row of a KV head is
//! loaded and widened from f16 once for all the query heads that share it, each head's dot
//! product runs in one 16-lane AVX-512 accumulator, and the group's output rows stay in
//! registers across the positions. Four positions' dot products are summed together (one
//! shuffle network for up to 16 sums, as the tiled prompt kernel), the rows' offsets are
//! worked out once per (token, KV head) block by block, and rows 64 positions ahead are
//! prefetched (a sequence's blocks are scattered over the pool).
//!
//! The results are those of [`crate::attn_paged::attn_paged_f16`] **bit for bit**: every
//! score, softmax and output element goes through the same operations in the same order (a
//! 16-lane accumulator holds exactly the two 8-lane accumulators of the AVX2 dot product side
//! by side; the value update is an elementwise FMA whatever its width). So routing a token
//! through this kernel or that one never changes a logit, and batch/prefix invariance holds
//! whichever runs. Where its fast path does not apply (no AVX-512 at the chosen ISA level, or
//! a head size that is not a multiple of 64) it calls that kernel.

use crate::attn_kv::{F16Rows, KvRows};
use crate::attn_paged::{PagedQuery, PagedShape, attn_paged_f16};
use crate::pool::ThreadPool;
use crate::quantdot::{Isa, KernelError, kernels};

/// Query heads of one group accumulated together (registers: 4 heads × 4 vectors).
const MAX_G: usize = 4;

/// Attention of every query token over its own sequence's blocks: the arguments and results
/// of [`attn_paged_f16`] (bit-identical), faster on AVX-512 for head sizes that are multiples
/// of 64.
pub fn attn_paged_f16_grouped(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    #[cfg(target_arch = "x86_64")]
    if fast_path(shape) {
        let (k, v) = (F16Rows(k), F16Rows(v));
        shape.check(queries, q, &k, &v, out)?;
        run(queries, q, k, v, shape, out, pool);
        return Ok(());
    }
    attn_paged_f16(queries, q, k, v, shape, out, pool)
}

/// Whether [`attn_paged_f16_grouped`] takes its own path for `shape` on this CPU and level.
pub fn fast_path(shape: PagedShape) -> bool {
    cfg!(target_arch = "x86_64")
        && shape.head_dim.is_multiple_of(64)
        && kernels().isa() >= Isa::Avx512
        && Isa::Avx512.is_available()
}

/// A thread's buffers, reused from unit to unit (every element a unit reads it wrote first).
#[derive(Debug, Default)]
struct Scratch {
    /// Scores, then weights, `[group, positions]`.
    scores: Vec<f32>,
    /// Element offset of each visible position's row in the pools, `[positions]`.
    rows: Vec<usize>,
}

/// (query, KV head) units over `pool`, each computed by one thread in one order.
#[cfg(target_arch = "x86_64")]
pub(crate) fn run<R: KvRows>(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) {
    let group = shape.n_head / shape.n_head_kv;
    let width = shape.n_head * shape.head_dim;
    let span = group * shape.head_dim;
    let n_units = queries.len() * shape.n_head_kv;
    let unit = |u: usize, o: &mut [f32], scratch: &mut Scratch| {
        let (t, kvh) = (u / shape.n_head_kv, u % shape.n_head_kv);
        let qg = &q[t * width + kvh * span..][..span];
        // SAFETY: AVX-512F/AVX2/FMA/F16C are available (`fast_path`); the shapes were checked.
        unsafe { x86::kv_head(qg, k, v, shape, &queries[t], kvh, o, scratch) };
    };
    let Some(pool) = pool.filter(|p| p.n_threads() > 1 && n_units > 1) else {
        let mut scratch = Scratch::default();
        for (u, o) in out.chunks_exact_mut(span).enumerate() {
            unit(u, o, &mut scratch);
        }
        return;
    };
    // Units handed out one at a time: a descheduled thread delays the step by one unit.
    let units: Vec<&mut [f32]> = out.chunks_exact_mut(span).collect();
    pool.for_each_task_with(units, &Scratch::default, &unit);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{MAX_G, Scratch};
    use crate::attn_decode::softmax_avx512;
    use crate::attn_decode::x86::hsum;
    use crate::attn_kv::KvRows;
    use crate::attn_paged::{PagedQuery, PagedShape};
    use crate::attn_paged_tiled::avx512::hsum16;

    /// Positions ahead whose rows are prefetched: blocks of a sequence are scattered over the
    /// pool, so the hardware prefetcher loses the stream at every block edge.
    const PF: usize = 64;

    /// Positions whose scores one step computes together (their 4·G sums in one [`hsum16`]).
    const NK: usize = 4;

    /// The element offsets of positions `lo..hi` of KV head `kvh` into `rows`, block by block
    /// (as `PagedShape::offset`, without a division per position).
    fn row_offsets(sh: &PagedShape, pq: &PagedQuery<'_>, kvh: usize, rows: &mut Vec<usize>) {
        rows.clear();
        let bs = sh.block_size;
        let mut p = pq.lo;
        while p < pq.hi {
            let (b, within) = (p / bs, p % bs);
            let end = ((b + 1) * bs).min(pq.hi);
            let base = (kvh * sh.n_slots + pq.table[b] as usize * bs) * sh.head_dim;
            rows.extend((within..within + end - p).map(|j| base + j * sh.head_dim));
            p = end;
        }
    }

    /// The query heads `qg` (`[group, head_dim]`) of KV head `kvh` of one token into `out`
    /// (`[group, head_dim]`): `attn_paged`'s per-unit computation, G heads at a time.
    ///
    /// # Safety
    /// AVX-512F, AVX2, FMA and F16C are available; `head_dim` is a multiple of 64; the
    /// query's positions and blocks lie in the pools (checked by the caller).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn kv_head<R: KvRows>(
        qg: &[f32],
        k: R,
        v: R,
        sh: PagedShape,
        pq: &PagedQuery<'_>,
        kvh: usize,
        out: &mut [f32],
        scratch: &mut Scratch,
    ) {
        let group = sh.n_head / sh.n_head_kv;
        let n = pq.hi - pq.lo;
        let Scratch { scores, rows } = scratch;
        row_offsets(&sh, pq, kvh, rows);
        scores.clear();
        scores.resize(group * n, 0.0); // [group, n]
        let mut g0 = 0;
        while g0 < group {
            let gn = (group - g0).min(MAX_G);
            // SAFETY: forwarded; heads g0..g0 + gn lie in qg/out, scores holds [group, n],
            // rows holds n offsets of rows inside the pools.
            unsafe {
                match gn {
                    1 => scores_g::<1, R>(qg, k, sh.head_dim, pq.scale, rows, g0, scores),
                    2 => scores_g::<2, R>(qg, k, sh.head_dim, pq.scale, rows, g0, scores),
                    3 => scores_g::<3, R>(qg, k, sh.head_dim, pq.scale, rows, g0, scores),
                    _ => scores_g::<4, R>(qg, k, sh.head_dim, pq.scale, rows, g0, scores),
                }
            }
            g0 += gn;
        }
        for s in scores.chunks_exact_mut(n) {
            // SAFETY: AVX-512F/AVX2/FMA/F16C available (this function's features); the
            // same bits as `softmax(true, ..)`, which the per-token kernel runs.
            unsafe { softmax_avx512(s) };
        }
        let mut g0 = 0;
        while g0 < group {
            let gn = (group - g0).min(MAX_G);
            // SAFETY: as above.
            unsafe {
                match gn {
                    1 => values_g::<1, R>(v, sh.head_dim, rows, g0, scores, out),
                    2 => values_g::<2, R>(v, sh.head_dim, rows, g0, scores, out),
                    3 => values_g::<3, R>(v, sh.head_dim, rows, g0, scores, out),
                    _ => values_g::<4, R>(v, sh.head_dim, rows, g0, scores, out),
                }
            }
            g0 += gn;
        }
    }

    /// Scores of heads `g0..g0 + G` over every visible position (`rows`): per head the AVX2
    /// `dot_f16`'s two 8-lane chains as one 16-lane chain, then its sum and the scale.
    /// [`NK`] positions at a time share one [`hsum16`] (the per-token sum's pairs, in its
    /// order); the last `n % NK` positions are summed one by one.
    ///
    /// # Safety
    /// As [`kv_head`].
    #[inline(always)]
    unsafe fn scores_g<const G: usize, R: KvRows>(
        qg: &[f32],
        k: R,
        hd: usize,
        scale: f32,
        rows: &[usize],
        g0: usize,
        scores: &mut [f32],
    ) {
        let n = rows.len();
        let qp = qg.as_ptr();
        // SAFETY: rows of hd halves at checked offsets; q rows g0..g0+G of hd floats.
        unsafe {
            let vscale = _mm512_set1_ps(scale);
            let mut i = 0;
            while i + NK <= n {
                for j in 0..NK {
                    if let Some(&r) = rows.get(i + j + PF) {
                        k.prefetch(r, hd);
                    }
                }
                // acc[NK·key + row]: `hsum16`'s layout (rows past G stay zero).
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut c = 0;
                while c < hd {
                    // 32 elements (one q8_0 block: one scale), in the 16-lane chain's order.
                    // (No closure here: it would not inherit this function's target features.)
                    let mut kv = [[_mm512_setzero_ps(); 2]; NK];
                    for (j, kv) in kv.iter_mut().enumerate() {
                        *kv = k.load32(rows[i + j] + c);
                    }
                    for h in 0..2 {
                        for g in 0..G {
                            let qv = _mm512_loadu_ps(qp.add((g0 + g) * hd + c + 16 * h));
                            for (key, kv) in kv.iter().enumerate() {
                                let a = &mut acc[NK * key + g];
                                *a = _mm512_fmadd_ps(qv, kv[h], *a);
                            }
                        }
                    }
                    c += 32;
                }
                // Lane NK·row + key: head g0 + row, position i + key.
                let mut sums = [0f32; 16];
                _mm512_storeu_ps(sums.as_mut_ptr(), _mm512_mul_ps(hsum16(&acc), vscale));
                for g in 0..G {
                    scores[(g0 + g) * n + i..][..NK].copy_from_slice(&sums[NK * g..][..NK]);
                }
                i += NK;
            }
            while i < n {
                let kr = rows[i];
                let mut acc = [_mm512_setzero_ps(); G];
                let mut c = 0;
                while c < hd {
                    let kv = k.load32(kr + c);
                    for (h, kv) in kv.iter().enumerate() {
                        for (g, a) in acc.iter_mut().enumerate() {
                            let qv = _mm512_loadu_ps(qp.add((g0 + g) * hd + c + 16 * h));
                            *a = _mm512_fmadd_ps(qv, *kv, *a);
                        }
                    }
                    c += 32;
                }
                for (g, a) in acc.iter().enumerate() {
                    let lo = _mm512_castps512_ps256(*a);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a)));
                    scores[(g0 + g) * n + i] = hsum(_mm256_add_ps(lo, hi)) * scale;
                }
                i += 1;
            }
        }
    }

    /// Output rows of heads `g0..g0 + G`, 64 columns at a time held in registers across
    /// the positions: `out += p · f16(v)` per element in position order (`axpy_f16`'s FMA).
    ///
    /// # Safety
    /// As [`kv_head`].
    #[inline(always)]
    unsafe fn values_g<const G: usize, R: KvRows>(
        v: R,
        hd: usize,
        rows: &[usize],
        g0: usize,
        scores: &[f32],
        out: &mut [f32],
    ) {
        let n = rows.len();
        let op = out.as_mut_ptr();
        // SAFETY: rows of hd halves at checked offsets; out rows g0..g0+G of hd floats.
        unsafe {
            for c0 in (0..hd).step_by(64) {
                let mut acc = [[_mm512_setzero_ps(); 4]; G];
                for (i, &r) in rows.iter().enumerate() {
                    if let Some(&ahead) = rows.get(i + PF) {
                        v.prefetch(ahead + c0, 64);
                    }
                    let [v0, v1] = v.load32(r + c0);
                    let [v2, v3] = v.load32(r + c0 + 32);
                    let vv = [v0, v1, v2, v3];
                    for (g, a) in acc.iter_mut().enumerate() {
                        let s = _mm512_set1_ps(scores[(g0 + g) * n + i]);
                        for (a, &x) in a.iter_mut().zip(&vv) {
                            *a = _mm512_fmadd_ps(s, x, *a);
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate() {
                    for (c, &x) in a.iter().enumerate() {
                        _mm512_storeu_ps(op.add((g0 + g) * hd + c0 + 16 * c), x);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_decode::tests::{data, f16_data};

    /// Scrambled block tables, windows, several sequences: bit-identical to `attn_paged_f16`
    /// (alone and in a batch, threaded or not), on the fast path's head sizes and others.
    #[test]
    fn grouped_equals_paged_bit_for_bit() {
        for &(n_head, n_head_kv, hd, bs, n_kv) in &[
            (1usize, 1usize, 64usize, 1usize, 1usize),
            (3, 1, 64, 3, 7),
            (9, 3, 64, 16, 33),
            (8, 1, 64, 4, 100),
            (4, 1, 256, 16, 70),
            (6, 3, 128, 5, 1023),
            (4, 2, 33, 4, 33),
            (5, 1, 16, 7, 3),
        ] {
            let shape_of = |n_slots| PagedShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                n_slots,
                block_size: bs,
            };
            let n_seq = 3;
            let per_seq = n_kv.div_ceil(bs);
            let n_blocks = n_seq * per_seq + 2;
            let sh = shape_of(n_blocks * bs);
            let kv_len = n_head_kv * sh.n_slots * hd;
            let k: Vec<u16> = f16_data(1, kv_len, 1.0);
            let v: Vec<u16> = f16_data(2, kv_len, 1.0);
            // Block ids reversed and interleaved between the sequences.
            let tables: Vec<Vec<u32>> = (0..n_seq)
                .map(|s| {
                    (0..per_seq)
                        .map(|b| (n_blocks - 1 - (b * n_seq + s)) as u32)
                        .collect()
                })
                .collect();
            let mut queries = Vec::new();
            for (s, t) in tables.iter().enumerate() {
                for hi in [1, n_kv.div_ceil(2), n_kv] {
                    queries.push(PagedQuery {
                        table: t,
                        lo: if s == 1 { hi.saturating_sub(5) } else { 0 },
                        hi,
                        scale: 0.125 + s as f32,
                    });
                }
            }
            let q = data(3, queries.len() * n_head * hd, 2.0);
            let mut want = vec![0f32; q.len()];
            attn_paged_f16(&queries, &q, &k, &v, sh, &mut want, None).unwrap();
            let pool = ThreadPool::new(3);
            for p in [None, Some(&pool)] {
                let mut got = vec![0f32; q.len()];
                attn_paged_f16_grouped(&queries, &q, &k, &v, sh, &mut got, p).unwrap();
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{n_head}/{n_head_kv} hd {hd} bs {bs} kv {n_kv}");
                // One query alone: the same bits as inside the batch.
                for (i, pq) in queries.iter().enumerate() {
                    let w = n_head * hd;
                    let mut one = vec![0f32; w];
                    attn_paged_f16_grouped(
                        std::slice::from_ref(pq),
                        &q[i * w..(i + 1) * w],
                        &k,
                        &v,
                        sh,
                        &mut one,
                        p,
                    )
                    .unwrap();
                    assert!(
                        one.iter()
                            .zip(&got[i * w..])
                            .all(|(a, b)| a.to_bits() == b.to_bits())
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let sh = PagedShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            n_slots: 8,
            block_size: 4,
        };
        let (k, v) = (vec![0u16; 8 * 64], vec![0u16; 8 * 64]);
        let table = [0u32, 5];
        let queries = [PagedQuery {
            table: &table,
            lo: 0,
            hi: 6,
            scale: 1.0,
        }];
        let q = vec![0f32; 128];
        let mut out = vec![0f32; 128];
        assert!(attn_paged_f16_grouped(&queries, &q, &k, &v, sh, &mut out, None).is_err());
        let mut short = vec![0f32; 127];
        assert!(attn_paged_f16_grouped(&queries, &q, &k, &v, sh, &mut short, None).is_err());
    }
}
