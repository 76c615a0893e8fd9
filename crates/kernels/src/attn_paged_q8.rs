//! Paged attention over a q8_0 KV pool (`--cache-type q8_0`): the kernels of
//! [`crate::attn_paged`], [`crate::attn_paged_tiled`] and [`crate::attn_group`] instantiated
//! on [`Q8Rows`] (each row of a head `head_dim / 32` blocks of i8 values with one f16 scale).
//!
//! A key or value row is widened to f32 in registers (`q · d`, exact), then goes through the
//! f16 kernels' arithmetic unchanged: scores are `dot(q, dequant(k))`, outputs
//! `Σ p · dequant(v)`. So the three routes (per token, tiled prompt chunks, grouped decode) give
//! the same bits for a token, as they do on f16, and batch and prefix invariance hold on a
//! q8_0 cache too. The pool holds half the bytes of an f16 pool plus one f16 per 32 values
//! (≈ 1.88× the positions in the same memory).

use crate::attn_kv::{Q8_BLOCK, Q8Rows};
use crate::attn_paged::{PagedQuery, PagedShape, attn_paged_with};
use crate::pool::ThreadPool;
use crate::quantdot::{Isa, KernelError, kernels};

/// Checks what the q8_0 layout adds to [`PagedShape`]'s own checks: whole blocks per row.
fn check_q8(shape: PagedShape) -> Result<(), KernelError> {
    if !shape.head_dim.is_multiple_of(Q8_BLOCK) || shape.head_dim == 0 {
        return Err(KernelError::BadShape(format!(
            "a q8_0 KV cache needs a head size that is a multiple of {Q8_BLOCK}, not {}",
            shape.head_dim
        )));
    }
    Ok(())
}

/// Attention of every query token over its own sequence's blocks of a q8_0 pool.
///
/// * `queries`: one per token, `q` `[queries.len(), n_head, head_dim]` f32 (rotated)
/// * `k`, `v`: the pools, `[n_head_kv, n_slots, head_dim]` q8_0 values
/// * `out`: `[queries.len(), n_head, head_dim]` f32
///
/// With AVX2, tiles of consecutive tokens (bit for bit [`attn_paged_q8_per_token`]); without,
/// the scalar per-token kernel ([`attn_paged_q8_scalar`]).
pub fn attn_paged_q8(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: Q8Rows<'_>,
    v: Q8Rows<'_>,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    check_q8(shape)?;
    crate::attn_paged_tiled::attn_paged_tiled(queries, q, k, v, shape, out, pool)
}

/// [`attn_paged_q8`] with a GQA group's heads together on AVX-512 (head sizes multiple of
/// 64): the decode route, bit for bit [`attn_paged_q8`]'s results; elsewhere it calls it.
pub fn attn_paged_q8_grouped(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: Q8Rows<'_>,
    v: Q8Rows<'_>,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    check_q8(shape)?;
    #[cfg(target_arch = "x86_64")]
    if crate::attn_group::fast_path(shape) {
        shape.check(queries, q, &k, &v, out)?;
        crate::attn_group::run(queries, q, k, v, shape, out, pool);
        return Ok(());
    }
    attn_paged_q8(queries, q, k, v, shape, out, pool)
}

/// The per-token kernel at the best ISA (AVX2 dot/axpy): the twin the tiled and grouped
/// routes equal bit for bit.
pub fn attn_paged_q8_per_token(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: Q8Rows<'_>,
    v: Q8Rows<'_>,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    check_q8(shape)?;
    let simd = kernels().isa() >= Isa::Avx2;
    attn_paged_with(simd, queries, q, k, v, shape, out, pool)
}

/// The scalar twin (single-threaded): plain loops over the dequantized values.
pub fn attn_paged_q8_scalar(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: Q8Rows<'_>,
    v: Q8Rows<'_>,
    shape: PagedShape,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_q8(shape)?;
    attn_paged_with(false, queries, q, k, v, shape, out, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_decode::tests::data;
    use crate::attn_kv::{KvRows, quantize_q8_0};

    /// A q8_0 pool of `n` values quantized from random data: (values, scales).
    fn q8_pool(seed: u64, n: usize) -> (Vec<i8>, Vec<u16>) {
        let x = data(seed, n, 1.5);
        let mut qs = vec![0i8; n];
        let mut d = vec![0u16; n / Q8_BLOCK];
        quantize_q8_0(&x, &mut qs, &mut d).unwrap();
        (qs, d)
    }

    /// f64 attention of one query over the dequantized values: the oracle.
    fn oracle(
        pq: &PagedQuery<'_>,
        q: &[f32],
        k: Q8Rows<'_>,
        v: Q8Rows<'_>,
        sh: PagedShape,
    ) -> Vec<f32> {
        let hd = sh.head_dim;
        let group = sh.n_head / sh.n_head_kv;
        let mut out = vec![0f32; sh.n_head * hd];
        for h in 0..sh.n_head {
            let kvh = h / group;
            let s: Vec<f64> = (pq.lo..pq.hi)
                .map(|p| {
                    let o = sh.offset(pq.table, p, kvh);
                    (0..hd)
                        .map(|i| q[h * hd + i] as f64 * k.get(o + i) as f64)
                        .sum::<f64>()
                        * pq.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (i, p) in (pq.lo..pq.hi).enumerate() {
                let o = sh.offset(pq.table, p, kvh);
                for j in 0..hd {
                    out[h * hd + j] += (e[i] / z * v.get(o + j) as f64) as f32;
                }
            }
        }
        out
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Awkward positions (1, 3, 7, 33, 1023), block tails, GQA groups 1..8, head sizes 32, 64,
    /// 128, 256, windows, several sequences with scrambled tables: scalar within 2e-5 of the
    /// f64 oracle; the per-token SIMD kernel within rounding of the scalar one; the tiled and
    /// grouped routes bit for bit the per-token SIMD kernel, alone and in a batch, on 1 and 3
    /// threads.
    #[test]
    fn q8_routes_agree_on_awkward_sizes() {
        let pool = ThreadPool::new(3);
        for &(n_head, n_head_kv, hd, bs, n_kv) in &[
            (1usize, 1usize, 64usize, 1usize, 1usize),
            (3, 1, 64, 3, 3),
            (2, 2, 32, 16, 7),
            (5, 1, 128, 16, 33),
            (8, 1, 64, 4, 100),
            (6, 3, 128, 5, 1023),
            (7, 7, 96, 16, 40),
            (4, 1, 256, 16, 70),
            (16, 2, 64, 7, 33),
        ] {
            let n_seq = 3;
            let per_seq = n_kv.div_ceil(bs);
            let n_blocks = n_seq * per_seq + 2;
            let sh = PagedShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                n_slots: n_blocks * bs,
                block_size: bs,
            };
            let n = n_head_kv * sh.n_slots * hd;
            let (kq, kd) = q8_pool(1, n);
            let (vq, vd) = q8_pool(2, n);
            let k = Q8Rows::new(&kq, &kd).unwrap();
            let v = Q8Rows::new(&vq, &vd).unwrap();
            let tables: Vec<Vec<u32>> = (0..n_seq)
                .map(|s| {
                    (0..per_seq)
                        .map(|b| (n_blocks - 1 - (b * n_seq + s)) as u32)
                        .collect()
                })
                .collect();
            // A prompt chunk (consecutive tokens) of each sequence, windowed for sequence 1.
            let mut queries = Vec::new();
            for (s, t) in tables.iter().enumerate() {
                for hi in (n_kv.saturating_sub(3)).max(1)..=n_kv {
                    queries.push(PagedQuery {
                        table: t,
                        lo: if s == 1 { hi.saturating_sub(5) } else { 0 },
                        hi,
                        scale: 0.125 + s as f32,
                    });
                }
            }
            let w = n_head * hd;
            let q = data(3, queries.len() * w, 2.0);
            let mut scalar = vec![0f32; q.len()];
            attn_paged_q8_scalar(&queries, &q, k, v, sh, &mut scalar).unwrap();
            for (i, pq) in queries.iter().enumerate() {
                let want = oracle(pq, &q[i * w..(i + 1) * w], k, v, sh);
                for (a, b) in scalar[i * w..(i + 1) * w].iter().zip(&want) {
                    assert!(
                        (a - b).abs() <= 2e-5 * (1.0 + b.abs()),
                        "scalar {a} vs oracle {b}"
                    );
                }
            }
            let mut per_token = vec![0f32; q.len()];
            attn_paged_q8_per_token(&queries, &q, k, v, sh, &mut per_token, None).unwrap();
            for (a, b) in per_token.iter().zip(&scalar) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "simd {a} vs scalar {b}"
                );
            }
            let simd = kernels().isa() >= Isa::Avx2;
            for p in [None, Some(&pool)] {
                let mut tiled = vec![0f32; q.len()];
                attn_paged_q8(&queries, &q, k, v, sh, &mut tiled, p).unwrap();
                let mut grouped = vec![0f32; q.len()];
                attn_paged_q8_grouped(&queries, &q, k, v, sh, &mut grouped, p).unwrap();
                let twin = if simd { &per_token } else { &scalar };
                let case = format!("{n_head}/{n_head_kv} hd {hd} bs {bs} kv {n_kv}");
                assert_eq!(bits(&tiled), bits(twin), "tiled {case}");
                assert_eq!(bits(&grouped), bits(twin), "grouped {case}");
                // Each token alone: the same bits as inside the batch.
                for (i, pq) in queries.iter().enumerate() {
                    let mut one = vec![0f32; w];
                    let qi = &q[i * w..(i + 1) * w];
                    attn_paged_q8_grouped(std::slice::from_ref(pq), qi, k, v, sh, &mut one, p)
                        .unwrap();
                    assert_eq!(bits(&one), bits(&twin[i * w..(i + 1) * w]), "alone {case}");
                }
            }
        }
    }

    #[test]
    fn q8_bad_shapes_are_errors() {
        let (qs, d) = (vec![0i8; 8 * 64], vec![0u16; 8 * 2]);
        let pool = Q8Rows::new(&qs, &d).unwrap();
        let table = [0u32, 1];
        let queries = [PagedQuery {
            table: &table,
            lo: 0,
            hi: 6,
            scale: 1.0,
        }];
        let ok = PagedShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            n_slots: 8,
            block_size: 4,
        };
        let q = vec![0f32; 128];
        let mut out = vec![0f32; 128];
        assert!(attn_paged_q8_grouped(&queries, &q, pool, pool, ok, &mut out, None).is_ok());
        // A head size that is not whole q8_0 blocks.
        let odd = PagedShape {
            head_dim: 48,
            n_slots: 4,
            ..ok
        };
        let mut out48 = vec![0f32; 96];
        let q48 = vec![0f32; 96];
        let e = attn_paged_q8(
            &queries[..0],
            &q48[..0],
            pool,
            pool,
            odd,
            &mut out48[..0],
            None,
        );
        assert!(e.is_err());
        // A block outside the pool; a pool too small for the shape.
        let bad = [PagedQuery {
            table: &[0, 9],
            ..queries[0]
        }];
        assert!(attn_paged_q8_grouped(&bad, &q, pool, pool, ok, &mut out, None).is_err());
        let big = PagedShape { n_slots: 16, ..ok };
        assert!(attn_paged_q8(&queries, &q, pool, pool, big, &mut out, None).is_err());
    }
}
