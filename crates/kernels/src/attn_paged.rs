//! Attention over a paged KV cache: the keys and values of many sequences share one head-major
//! pool `[n_head_kv, n_slots, head_dim]` (f16), cut into blocks of `block_size` slots; a
//! sequence's position `p` lives in slot `table[p / block_size] * block_size + p % block_size`.
//!
//! Every query token is computed on its own, over its own sequence's blocks, in one fixed order
//! (scores of every visible position, softmax, weighted values, as [`crate::attn_decode`]):
//! the result of a token depends only on its query and its sequence's cache, never on which
//! other tokens or sequences share the call, nor on the thread count. That is what makes a
//! batched forward pass give the same logits as a sequence run alone, and a prompt computed
//! over a cached prefix the same logits as computed fresh.

use crate::attn_decode::softmax;
use crate::attn_kv::{F16Rows, KvRows};
use crate::pool::ThreadPool;
use crate::quantdot::{Isa, KernelError, kernels};

/// Geometry of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (`n_head` is a multiple of it).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Slots (positions) of the pool per head: `n_blocks * block_size`.
    pub n_slots: usize,
    /// Slots per block.
    pub block_size: usize,
}

/// One query token: which positions of which sequence it attends to.
#[derive(Clone, Copy, Debug)]
pub struct PagedQuery<'a> {
    /// The sequence's block table.
    pub table: &'a [u32],
    /// First visible position (a sliding window's start; 0 for full attention).
    pub lo: usize,
    /// One past the last visible position (the token's own position + 1).
    pub hi: usize,
    /// Score scale (`1 / sqrt(head_dim)` unless the model says otherwise).
    pub scale: f32,
}

impl PagedShape {
    /// Slot offset (in halves) of position `p` of a sequence with `table`, KV head `kvh`.
    #[inline]
    pub(crate) fn offset(&self, table: &[u32], p: usize, kvh: usize) -> usize {
        // Slot offset in elements: halves for f16, values for q8_0.
        let slot = table[p / self.block_size] as usize * self.block_size + p % self.block_size;
        (kvh * self.n_slots + slot) * self.head_dim
    }

    pub(crate) fn check<R: KvRows>(
        &self,
        queries: &[PagedQuery<'_>],
        q: &[f32],
        k: &R,
        v: &R,
        out: &[f32],
    ) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::BadShape(m));
        let PagedShape {
            n_head,
            n_head_kv,
            head_dim,
            n_slots,
            block_size,
        } = *self;
        if n_head_kv == 0 || head_dim == 0 || block_size == 0 || n_head % n_head_kv != 0 {
            return bad(format!("bad paged shape {self:?}"));
        }
        let width = n_head * head_dim;
        if q.len() != queries.len() * width || out.len() != q.len() {
            return bad(format!(
                "q/out hold {}/{} floats, expected {} queries of {width}",
                q.len(),
                out.len(),
                queries.len()
            ));
        }
        let need = n_slots.saturating_mul(n_head_kv * head_dim);
        if k.n_elems() < need || v.n_elems() < need {
            return bad(format!(
                "k/v pools hold {}/{} values, need {need}",
                k.n_elems(),
                v.n_elems()
            ));
        }
        let n_blocks = n_slots / block_size;
        for (i, pq) in queries.iter().enumerate() {
            if pq.lo >= pq.hi || pq.hi.div_ceil(block_size) > pq.table.len() {
                return bad(format!(
                    "query {i}: positions {}..{} with {} blocks of {block_size}",
                    pq.lo,
                    pq.hi,
                    pq.table.len()
                ));
            }
            if let Some(&b) = pq.table.iter().find(|&&b| b as usize >= n_blocks) {
                return bad(format!("query {i}: block {b} of a pool of {n_blocks}"));
            }
        }
        Ok(())
    }
}

/// Attention of every query token over its own sequence's blocks.
///
/// * `queries`: one per token, `q` `[queries.len(), n_head, head_dim]` f32 (rotated)
/// * `k`, `v`: the pools, f16 bits `[n_head_kv, n_slots, head_dim]`
/// * `out`: `[queries.len(), n_head, head_dim]` f32
///
/// With SIMD, runs of consecutive tokens of one sequence go through
/// [`crate::attn_paged_tiled`] (each key and value row loaded once per tile, bit-identical to
/// the per-token kernel); without, every token through the per-token scalar kernel.
pub fn attn_paged_f16(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    crate::attn_paged_tiled::attn_paged_tiled(queries, q, F16Rows(k), F16Rows(v), shape, out, pool)
}

/// The per-token kernel at the best ISA: the twin [`attn_paged_f16`]'s tiled path must equal
/// bit for bit. (query, KV head) units are spread over `pool`; each unit is computed by one
/// thread in one order, so the result of a token does not depend on the others or on the
/// thread count.
pub fn attn_paged_f16_per_token(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    attn_paged_with(
        kernels().isa() >= Isa::Avx2,
        queries,
        q,
        F16Rows(k),
        F16Rows(v),
        shape,
        out,
        pool,
    )
}

/// The scalar twin of [`attn_paged_f16`] (single-threaded).
pub fn attn_paged_f16_scalar(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attn_paged_with(false, queries, q, F16Rows(k), F16Rows(v), shape, out, None)
}

/// The per-token kernel over any pool element type (`simd`: the AVX2 dot/axpy when present).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attn_paged_with<R: KvRows>(
    simd: bool,
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    shape.check(queries, q, &k, &v, out)?;
    #[cfg(target_arch = "x86_64")]
    let simd = simd && Isa::Avx2.is_available();
    let group = shape.n_head / shape.n_head_kv;
    let width = shape.n_head * shape.head_dim;
    let span = group * shape.head_dim;
    let n_units = queries.len() * shape.n_head_kv;
    let unit = |u: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (t, kvh) = (u / shape.n_head_kv, u % shape.n_head_kv);
        let qg = &q[t * width + kvh * span..][..span];
        kv_head(simd, qg, k, v, shape, &queries[t], kvh, o, scores);
    };
    let Some(pool) = pool.filter(|p| p.n_threads() > 1 && n_units > 1) else {
        let mut scores = Vec::new();
        for (u, o) in out.chunks_exact_mut(span).enumerate() {
            unit(u, o, &mut scores);
        }
        return Ok(());
    };
    // One chunk of several units, so a thread's score buffer serves them all; units are
    // contiguous `[span]` pieces of `out` (u = t·n_head_kv + kvh).
    let per = crate::pool::chunk_len(n_units, 1, pool.n_threads());
    pool.for_each_chunk_mut(out, per * span, &|c, o| {
        let mut scores = Vec::new();
        for (i, o) in o.chunks_exact_mut(span).enumerate() {
            unit(c * per + i, o, &mut scores);
        }
    });
    Ok(())
}

/// The query heads `qg` (`[group, head_dim]`) of KV head `kvh` of one token; `out`:
/// `[group, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_head<R: KvRows>(
    simd: bool,
    qg: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    pq: &PagedQuery<'_>,
    kvh: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let n = pq.hi - pq.lo;
    scores.clear();
    scores.resize(group * n, 0.0); // [group, n]
    for (i, p) in (pq.lo..pq.hi).enumerate() {
        let kr = shape.offset(pq.table, p, kvh);
        for g in 0..group {
            scores[g * n + i] = k.dot(simd, &qg[g * hd..(g + 1) * hd], kr) * pq.scale;
        }
    }
    for s in scores.chunks_exact_mut(n) {
        softmax(simd, s);
    }
    out.fill(0.0);
    for (i, p) in (pq.lo..pq.hi).enumerate() {
        let vr = shape.offset(pq.table, p, kvh);
        for g in 0..group {
            v.axpy(simd, &mut out[g * hd..(g + 1) * hd], scores[g * n + i], vr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_decode::tests::{data, f16_data};
    use crate::attn_decode::{DecodeShape, KvLayout, attn_decode_f16_scalar};

    /// A pool with a scrambled block table, against the decode kernel over the same positions
    /// laid out contiguously: equal (same order, same arithmetic); SIMD against scalar within
    /// rounding; the same token alone and inside a batch bit-identical.
    #[test]
    fn paged_matches_contiguous_decode_on_awkward_sizes() {
        for &(n_head, n_head_kv, hd, bs, n_kv) in &[
            (1usize, 1usize, 1usize, 1usize, 1usize),
            (3, 1, 7, 3, 7),
            (4, 2, 33, 4, 33),
            (9, 3, 64, 16, 100),
            (8, 8, 64, 5, 1023),
        ] {
            let n_blocks = n_kv.div_ceil(bs) + 3;
            let n_slots = n_blocks * bs;
            // Scrambled table: block i of the sequence is pool block (i * 7 + 2) % n_blocks.
            let mut table: Vec<u32> = Vec::new();
            let mut b = 2usize;
            while table.len() < n_kv.div_ceil(bs) {
                b = (b + 7) % n_blocks;
                if !table.contains(&(b as u32)) {
                    table.push(b as u32);
                } else {
                    b += 1;
                }
            }
            let kc: Vec<u16> = f16_data(1, n_kv * n_head_kv * hd, 1.0);
            let vc: Vec<u16> = f16_data(2, n_kv * n_head_kv * hd, 1.0);
            let shape = PagedShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                n_slots,
                block_size: bs,
            };
            // Scatter the contiguous head-major cache into the pool.
            let (mut kp, mut vp) = (
                vec![0u16; n_slots * n_head_kv * hd],
                vec![0u16; n_slots * n_head_kv * hd],
            );
            for kvh in 0..n_head_kv {
                for p in 0..n_kv {
                    let src = (kvh * n_kv + p) * hd;
                    let dst = shape.offset(&table, p, kvh);
                    kp[dst..dst + hd].copy_from_slice(&kc[src..src + hd]);
                    vp[dst..dst + hd].copy_from_slice(&vc[src..src + hd]);
                }
            }
            let q = data(3, n_head * hd, 1.0);
            let dshape = DecodeShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                layout: KvLayout::HeadMajor { n_ctx: n_kv },
            };
            let mut want = vec![0f32; n_head * hd];
            attn_decode_f16_scalar(&q, &kc, &vc, dshape, n_kv, &mut want).unwrap();
            let one = [PagedQuery {
                table: &table,
                lo: 0,
                hi: n_kv,
                scale: 1.0 / (hd as f32).sqrt(),
            }];
            let mut got = vec![0f32; n_head * hd];
            attn_paged_f16_scalar(&one, &q, &kp, &vp, shape, &mut got).unwrap();
            assert_eq!(
                got, want,
                "scalar paged vs decode {n_head}/{n_head_kv}/{hd} bs {bs}"
            );
            let mut fast = vec![0f32; n_head * hd];
            attn_paged_f16(&one, &q, &kp, &vp, shape, &mut fast, None).unwrap();
            for (a, b) in fast.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "simd {a} vs scalar {b}"
                );
            }
            // The same token inside a batch of others (shorter windows), on 3 threads.
            let pool = ThreadPool::new(3);
            let mut batch = vec![one[0]; 4];
            batch[0].hi = 1;
            batch[2].lo = n_kv / 2;
            batch[3].hi = n_kv.div_ceil(2);
            let qb: Vec<f32> = (0..4).flat_map(|_| q.iter().copied()).collect();
            let mut outb = vec![0f32; 4 * n_head * hd];
            attn_paged_f16(&batch, &qb, &kp, &vp, shape, &mut outb, Some(&pool)).unwrap();
            assert_eq!(
                &outb[n_head * hd..2 * n_head * hd],
                &fast[..],
                "batched differs from alone"
            );
        }
    }

    #[test]
    fn rejects_tables_outside_the_pool() {
        let shape = PagedShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 2,
            n_slots: 4,
            block_size: 2,
        };
        let (k, v, q) = (vec![0u16; 8], vec![0u16; 8], vec![0f32; 2]);
        let mut out = vec![0f32; 2];
        let bad = [PagedQuery {
            table: &[5],
            lo: 0,
            hi: 1,
            scale: 1.0,
        }];
        assert!(attn_paged_f16(&bad, &q, &k, &v, shape, &mut out, None).is_err());
        let short = [PagedQuery {
            table: &[0],
            lo: 0,
            hi: 3,
            scale: 1.0,
        }];
        assert!(attn_paged_f16(&short, &q, &k, &v, shape, &mut out, None).is_err());
    }
}
