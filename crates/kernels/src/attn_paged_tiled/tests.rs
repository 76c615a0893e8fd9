use super::*;
use crate::attn_decode::tests::{data, f16_data};
use crate::attn_paged::{attn_paged_f16_per_token, attn_paged_f16_scalar};

/// A pool of `n_blocks` blocks with random f16 keys and values.
fn pool_data(shape: PagedShape, seed: u64) -> (Vec<u16>, Vec<u16>) {
    let n = shape.n_slots * shape.n_head_kv * shape.head_dim;
    (f16_data(seed, n, 1.5), f16_data(seed + 1, n, 1.5))
}

/// A scrambled table of `n` blocks out of `n_blocks`.
fn table(n: usize, n_blocks: usize, seed: usize) -> Vec<u32> {
    let mut t: Vec<u32> = Vec::new();
    let mut b = seed % n_blocks;
    while t.len() < n {
        b = (b + 7) % n_blocks;
        while t.contains(&(b as u32)) {
            b = (b + 1) % n_blocks;
        }
        t.push(b as u32);
    }
    t
}

/// Queries at `positions` of a sequence with `table` (`window` 0: full attention).
fn chunk(
    table: &[u32],
    positions: std::ops::Range<usize>,
    window: usize,
    scale: f32,
) -> Vec<PagedQuery<'_>> {
    positions
        .map(|p| PagedQuery {
            table,
            lo: if window == 0 {
                0
            } else {
                (p + 1).saturating_sub(window)
            },
            hi: p + 1,
            scale,
        })
        .collect()
}

/// The per-token kernel with its SIMD dot/axpy whenever the CPU has AVX2, whatever level
/// `DAMASCUS_ISA` forces: what every tiled body (which the tests call by level) must equal.
/// At the scalar level [`attn_paged_f16_per_token`] is the scalar twin, which rounds
/// differently.
fn per_token_simd(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    pool: Option<&ThreadPool>,
) -> Vec<f32> {
    let mut out = vec![0f32; q.len()];
    crate::attn_paged::attn_paged_with(
        true,
        queries,
        q,
        F16Rows(k),
        F16Rows(v),
        shape,
        &mut out,
        pool,
    )
    .unwrap();
    out
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Prompt chunks of `n_q` tokens after a cached prefix of `n_kv - n_q` positions (one
/// sequence, optionally a sliding window), and a batch of two such sequences: the tiled kernel
/// equals the per-token kernel bit for bit, alone and on 3 threads; the scalar build equals the
/// per-token scalar kernel.
#[test]
fn tiled_equals_per_token_bitwise_on_awkward_sizes() {
    let pool = ThreadPool::new(3);
    let mut cases = 0;
    for &(n_head, n_head_kv, hd) in &[
        (1usize, 1usize, 64usize),
        (4, 1, 256),
        (8, 2, 128),
        (6, 2, 64),
        (3, 3, 7),
        (5, 1, 33),
        (2, 1, 24),
        (4, 2, 40),
        (3, 1, 16),
        (5, 5, 48),
        (12, 2, 80),
        (8, 1, 128),
        (7, 1, 64),
        (32, 8, 128),
    ] {
        for &(n_q, n_kv, window) in &[
            (1usize, 1usize, 0usize),
            (1, 1023, 0),
            (3, 3, 0),
            (3, 7, 2),
            (7, 33, 0),
            (7, 33, 5),
            (33, 33, 0),
            (33, 1023, 0),
            (33, 1023, 100),
            (1, 33, 16),
        ] {
            let bs = [1usize, 3, 16][cases % 3];
            let n_blocks = 2 * n_kv.div_ceil(bs) + 2;
            let shape = PagedShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                n_slots: n_blocks * bs,
                block_size: bs,
            };
            let (k, v) = pool_data(shape, 10 + cases as u64);
            let (ta, tb) = (
                table(n_kv.div_ceil(bs), n_blocks, 3),
                table(n_kv.div_ceil(bs), n_blocks, 11),
            );
            let scale = 1.0 / (hd as f32).sqrt();
            let one = chunk(&ta, n_kv - n_q..n_kv, window, scale);
            let two: Vec<PagedQuery<'_>> = one
                .iter()
                .copied()
                .chain(chunk(&tb, n_kv - n_q..n_kv, window, scale))
                .collect();
            for queries in [&one, &two] {
                let q = data(100 + cases as u64, queries.len() * n_head * hd, 2.0);
                let mut want = vec![0f32; q.len()];
                attn_paged_f16_per_token(queries, &q, &k, &v, shape, &mut want, None).unwrap();
                for p in [None, Some(&pool)] {
                    let mut got = vec![f32::NAN; q.len()];
                    attn_paged_f16_tiled(queries, &q, &k, &v, shape, &mut got, p).unwrap();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "heads {n_head}/{n_head_kv} hd {hd} bs {bs}: {n_q} of {n_kv}, window {window}"
                    );
                    // Every body this CPU runs (AVX2, AVX-512) gives the per-token SIMD
                    // kernel's bits, whatever level the process runs at.
                    let want = per_token_simd(queries, &q, &k, &v, shape, None);
                    for isa in [Isa::Avx2, Isa::Avx512] {
                        if !isa.is_available() {
                            continue;
                        }
                        let mut got = vec![f32::NAN; q.len()];
                        attn_paged_f16_tiled_at(isa, queries, &q, &k, &v, shape, &mut got, p)
                            .unwrap();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{isa:?}: heads {n_head}/{n_head_kv} hd {hd} bs {bs}: {n_q} of {n_kv}, window {window}"
                        );
                    }
                }
                let mut scalar = vec![0f32; q.len()];
                attn_paged_f16_scalar(queries, &q, &k, &v, shape, &mut scalar).unwrap();
                if kernels().isa() < Isa::Avx2 {
                    assert_eq!(bits(&scalar), bits(&want));
                }
            }
            cases += 1;
        }
    }
}

/// Whole long prompts (1023 tokens from position 0, several tiles, the diagonal of each) at
/// GQA groups 1, 4 and 8 and head sizes 64/128/256, with and without a window: every body
/// equals the per-token kernel bit for bit, alone and on 2 threads.
#[test]
fn long_prompts_equal_per_token_bitwise() {
    let pool = ThreadPool::new(2);
    for &(n_head, n_head_kv, hd, window) in &[
        (4usize, 4usize, 64usize, 0usize),
        (8, 2, 128, 0),
        (8, 1, 256, 0),
        (8, 2, 128, 300),
        (6, 3, 64, 33),
    ] {
        let (n, bs) = (1023usize, 16usize);
        let n_blocks = n.div_ceil(bs) + 1;
        let shape = PagedShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            n_slots: n_blocks * bs,
            block_size: bs,
        };
        let (k, v) = pool_data(shape, 3);
        let t = table(n.div_ceil(bs), n_blocks, 1);
        let queries = chunk(&t, 0..n, window, 1.0 / (hd as f32).sqrt());
        let q = data(5, n * n_head * hd, 2.0);
        let mut want = vec![0f32; q.len()];
        attn_paged_f16_per_token(&queries, &q, &k, &v, shape, &mut want, Some(&pool)).unwrap();
        if kernels().isa() < Isa::Avx2 {
            // The scalar level's per-token kernel is the scalar twin; the bodies below are
            // SIMD and equal the SIMD per-token kernel.
            want = per_token_simd(&queries, &q, &k, &v, shape, Some(&pool));
        }
        for isa in [Isa::Avx2, Isa::Avx512] {
            if !isa.is_available() {
                continue;
            }
            for p in [None, Some(&pool)] {
                let mut got = vec![f32::NAN; q.len()];
                attn_paged_f16_tiled_at(isa, &queries, &q, &k, &v, shape, &mut got, p).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} heads {n_head}/{n_head_kv} hd {hd} window {window}"
                );
            }
        }
    }
}

/// Tokens of one sequence computed as one chunk, as chunks of 5, or one at a time give the
/// same bits (the prefix-invariance the model tests rely on).
#[test]
fn chunking_does_not_change_bits() {
    let shape = PagedShape {
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_slots: 64 * 16,
        block_size: 16,
    };
    let (k, v) = pool_data(shape, 7);
    let t = table(40, 64, 5);
    let queries: Vec<PagedQuery<'_>> = (0..600usize)
        .map(|p| PagedQuery {
            table: &t,
            lo: (p + 1).saturating_sub(512),
            hi: p + 1,
            scale: 0.0625,
        })
        .collect();
    let w = shape.n_head * shape.head_dim;
    let q = data(9, queries.len() * w, 2.0);
    let mut whole = vec![0f32; q.len()];
    attn_paged_f16_tiled(&queries, &q, &k, &v, shape, &mut whole, None).unwrap();
    for step in [5usize, 1] {
        let mut parts = vec![0f32; q.len()];
        for s in (0..queries.len()).step_by(step) {
            let e = (s + step).min(queries.len());
            attn_paged_f16_tiled(
                &queries[s..e],
                &q[s * w..e * w],
                &k,
                &v,
                shape,
                &mut parts[s * w..e * w],
                None,
            )
            .unwrap();
        }
        assert_eq!(bits(&parts), bits(&whole), "chunks of {step}");
    }
}

#[test]
fn rejects_bad_tables() {
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
    assert!(attn_paged_f16_tiled(&bad, &q, &k, &v, shape, &mut out, None).is_err());
}
