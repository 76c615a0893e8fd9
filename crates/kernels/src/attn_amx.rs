//! Prefill attention on AMX-BF16 tiles: causal GQA attention of a block of new query tokens
//! over a head-major f16 KV cache, as two tile GEMMs per block of 32 queries with an exact
//! (two-pass) softmax between them.
//!
//! **Precision.** bf16 operands alone (8 significant bits) are not enough: SmolLM2's
//! massive activations give scores of ±100, and rounding Q and K to bf16 moved its logits by
//! a cosine of 1.4e-3. So every operand is split into `hi = bf16(x)` and `lo = bf16(x − hi)`
//! (exact for the f16 keys and values, ≈ 16 bits for the f32 queries and probabilities) and
//! each product is `hi·hi + hi·lo + lo·hi`, laid out as three k-passes in one tile stream:
//! the results are within f32-like rounding of the f32 decode kernel, for 3× the tile work
//! (which is small next to the rest of a prompt).
//!
//! Phase 1 (jobs of 32 keys of one KV head, split over the pool) packs the visible keys and
//! values once into AMX B-operand tiles (bf16 pairs, see [`crate::gemm`]'s module docs):
//! * keys, per key tile `[hi, lo, hi][head_dim / 32][16 dim pairs][16 keys]`: `S = Q · Kᵀ`
//!   needs pairs along the head dimension;
//! * values, per dim tile and key step `[hi, lo, hi][16 key pairs][16 dims]`: `O = P · V`
//!   needs pairs along the keys.
//!
//! Phase 2, a unit = one query head × 32 query tokens:
//! 1. the queries become A tiles (`[hi, hi, lo][16 queries][32 dims]` per k-step);
//! 2. `S` (`[32, keys]` f32) by 2 × 2 tile steps over the key tiles the block can see;
//! 3. per query: causal mask, `p = exp(scale · (s − max))` and `Σp` in f32, then split into
//!    A tiles (`[hi, hi, lo]` per key step);
//! 4. `O = P · V` by 2 × 2 tile steps over the head dimension, each a full reduction over the
//!    visible keys, scaled by `1 / Σp` into `out`.
//!
//! Token `t` of the prompt sees positions `0..=pos0 + t`. The tests run the same driver on
//! the scalar tile emulation and compare with the per-token decode kernel (f32), and on AMX
//! machines the tiles themselves.

use std::cell::RefCell;

use crate::attn_decode::DecodeShape;
use crate::attn_prefill::check_shapes;
use crate::elementwise::{exp_fast, f16_to_f32_slice};
use crate::gemm::amx::{Step, TileArgs, TileGuard, run_step};
use crate::gemm::micro::{pack_group, to_bf16_strided};
use crate::gemm::{GemmPath, KSTEP, TILE, bf16_to_f32, f32_to_bf16};
use crate::pool::{ThreadPool, pieces};
use crate::quantdot::KernelError;

/// Query tokens per unit (two A tiles).
pub const QB: usize = 2 * TILE;

/// The shortest prompt worth the tiles: below one full query block the A tiles are mostly
/// padding, the f32 kernel ([`crate::attn_prefill`]) is as fast, and it rounds like the decode
/// kernel. (On SmolLM2 the ≈ 16-bit operand splits moved 5- and 8-token prompts by a logits
/// cosine of up to 2e-3 once the Q8 activation rounding had amplified them through 30 layers;
/// from 32 tokens on the attention cost matters and the long fixture stays at 0.999996.)
pub const MIN_TOKENS: usize = QB;

/// Whether [`attn_prefill_amx`] can run here for `head_dim` (AMX-BF16 granted, `head_dim` a
/// multiple of 32).
pub fn is_available(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(KSTEP) && GemmPath::Amx.is_available()
}

thread_local! {
    /// The caller's packed keys and values, kept between calls (one prompt calls once per
    /// layer).
    static KV: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Causal attention of `n_tokens` queries at positions `pos0..pos0 + n_tokens` on AMX tiles.
///
/// * `q`: `[n_tokens, n_head, head_dim]` f32 (rotated)
/// * `k`, `v`: `[n_head_kv, n_ctx, head_dim]` f16 bits (head-major), positions
///   `0..pos0 + n_tokens` written
/// * `out`: `[n_tokens, n_head, head_dim]` f32
///
/// Errors on inconsistent shapes or where [`is_available`] is false.
pub fn attn_prefill_amx(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    pos0: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    let hd = shape.head_dim;
    if !is_available(hd) {
        return Err(KernelError::BadShape(format!(
            "AMX prefill attention is not available here for head_dim {hd}"
        )));
    }
    run(Step::Tiles, q, k, v, shape, pos0, out, pool)
}

/// The driver on `step` (tiles or their emulation).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    step: Step,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    pos0: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    let (n_ctx, n_tokens) = check_shapes(
        q.len(),
        out.len(),
        k.len(),
        v.len(),
        shape,
        pos0,
        shape.head_dim.is_multiple_of(KSTEP),
        "head_dim a multiple of 32",
    )?;
    let DecodeShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        ..
    } = shape;
    let width = n_head * hd;
    if n_tokens == 0 {
        return Ok(());
    }
    let n_keys = pos0 + n_tokens;
    let lp = n_keys.next_multiple_of(2 * TILE); // padded keys
    // One key tile: [3][hd / 32][16][16] u32 (hi, lo, hi); one value key step of a dim
    // tile: [3][16][16] (hi, lo, hi).
    let kt_words = 3 * hd * TILE / 2;
    let head_words_k = lp / TILE * kt_words;
    let vs_words = 3 * TILE * TILE;
    let head_words_v = hd / TILE * (lp / KSTEP) * vs_words;
    let nt = pool.map_or(1, |p| p.n_threads());
    KV.with_borrow_mut(|(kp, vp)| {
        kp.resize(n_head_kv * head_words_k, 0);
        vp.resize(n_head_kv * head_words_v, 0);
        // Phase 1: jobs (K or V, head, block of 32 keys), split over the threads; each job
        // widens its 32 cache rows (contiguous, head-major) and writes its own tiles.
        {
            let steps = lp / KSTEP;
            let n_jobs = 2 * n_head_kv * steps;
            // Job j < n_head_kv·steps (K, head h, step s) owns key tiles 2s and 2s + 1 of
            // head h: piece j of `kp` cut into 2·kt_words; a V job owns the hd / 16 dim tiles
            // of its step: pieces (h·hd/16 + dt)·steps + s of `vp` cut into vs_words.
            let mut vtiles = pieces(vp, vs_words);
            let jobs: Vec<(usize, Vec<&mut [u32]>)> = kp
                .chunks_mut(2 * kt_words)
                .enumerate()
                .map(|(j, kt)| (j, vec![kt]))
                .chain((0..n_head_kv * steps).map(|hs| {
                    let (h, st) = (hs / steps, hs % steps);
                    let dts = (0..hd / TILE)
                        .filter_map(|dt| vtiles[(h * (hd / TILE) + dt) * steps + st].take())
                        .collect();
                    (n_head_kv * steps + hs, dts)
                }))
                .collect();
            debug_assert_eq!(jobs.len(), n_jobs);
            let scratch = || {
                (
                    vec![0f32; KSTEP * hd], // [32 keys, hd] f32
                    vec![0u32; kt_words],   // one key tile: [3][hd / 32][16][16]
                    vec![0f32; TILE * hd],  // [16 keys, hd] f32 residuals
                )
            };
            let pack =
                |_: usize,
                 (j, mut dst): (usize, Vec<&mut [u32]>),
                 (rows, tiles, low): &mut (Vec<f32>, Vec<u32>, Vec<f32>)| {
                    let (is_v, h, s) = (j >= n_head_kv * steps, j / steps % n_head_kv, j % steps);
                    let cache = if is_v { v } else { k };
                    let first = s * KSTEP;
                    let valid = n_keys.saturating_sub(first).min(KSTEP);
                    let src = &cache[(h * n_ctx + first) * hd..][..valid * hd];
                    f16_to_f32_slice(src, &mut rows[..valid * hd]);
                    rows[valid * hd..].fill(0.0);
                    if !is_v {
                        let part = hd * TILE / 2;
                        for half in 0..2 {
                            let r = &rows[half * TILE * hd..(half + 1) * TILE * hd];
                            for (l, &x) in low.iter_mut().zip(r) {
                                *l = x - bf16_to_f32(f32_to_bf16(x));
                            }
                            pack_group(r, hd, &mut tiles[..part]);
                            pack_group(low, hd, &mut tiles[part..2 * part]);
                            tiles.copy_within(..part, 2 * part);
                            if let Some(d) = dst.first_mut() {
                                d[half * kt_words..(half + 1) * kt_words].copy_from_slice(tiles);
                            }
                        }
                    } else {
                        let mut tile = [0u32; 3 * TILE * TILE]; // [hi, lo, hi][16 pairs][16 dims]
                        for dt in 0..hd / TILE {
                            for p in 0..TILE {
                                let (e, o) = (&rows[2 * p * hd..], &rows[(2 * p + 1) * hd..]);
                                for n in 0..TILE {
                                    let d = dt * TILE + n;
                                    let (he, ho) = (f32_to_bf16(e[d]), f32_to_bf16(o[d]));
                                    let le = f32_to_bf16(e[d] - bf16_to_f32(he));
                                    let lo = f32_to_bf16(o[d] - bf16_to_f32(ho));
                                    tile[p * TILE + n] = u32::from(he) | (u32::from(ho) << 16);
                                    tile[(TILE + p) * TILE + n] =
                                        u32::from(le) | (u32::from(lo) << 16);
                                }
                            }
                            tile.copy_within(..TILE * TILE, 2 * TILE * TILE);
                            if let Some(d) = dst.get_mut(dt) {
                                d.copy_from_slice(&tile);
                            }
                        }
                    }
                };
            match pool {
                Some(p) if nt > 1 => p.for_each_task_with(jobs, &scratch, &pack),
                _ => {
                    let mut sc = scratch();
                    for (i, job) in jobs.into_iter().enumerate() {
                        pack(i, job, &mut sc);
                    }
                }
            }
        }
        // Phase 2: units (query head, query block), later blocks first (they see more keys).
        let (kp, vp) = (&kp[..], &vp[..]);
        let n_qb = n_tokens.div_ceil(QB);
        let n_units = n_head * n_qb;
        // Unit (query block, query head hq) owns, per token of its block, the head's
        // `[hd]` output columns: `out` cut into `[hd]` pieces, piece t·n_head + hq.
        let mut heads = pieces(out, hd);
        let units: Vec<(usize, usize, Vec<&mut [f32]>)> = (0..n_units)
            .map(|u| {
                let (qb, hq) = (n_qb - 1 - u / n_head, u % n_head);
                let t0 = qb * QB;
                let rows = (t0..(t0 + QB).min(n_tokens))
                    .filter_map(|t| heads[t * n_head + hq].take())
                    .collect();
                (qb, hq, rows)
            })
            .collect();
        let group = n_head / n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        let nks_d = hd / KSTEP;
        let scratch = || Phase2 {
            _tiles: (step == Step::Tiles).then(TileGuard::new),
            qa: vec![0u16; 3 * QB * hd],
            qlow: vec![0f32; hd],
            s: vec![0f32; QB * lp],
            pa: vec![0u16; 3 * QB * lp],
            plow: vec![0f32; lp],
            inv: [0f32; QB],
            c: [0f32; 4 * TILE * TILE],
        };
        let work = |_: usize,
                    (qb, hq, mut rows): (usize, usize, Vec<&mut [f32]>),
                    sc: &mut Phase2| {
            let Phase2 {
                qa,
                qlow,
                s,
                pa,
                plow,
                inv,
                c,
                ..
            } = sc;
            let hk = hq / group;
            let t0 = qb * QB;
            let nq = (n_tokens - t0).min(QB);
            let seen = pos0 + t0 + nq; // keys the last query of the block sees
            let ls = seen.next_multiple_of(2 * TILE);
            // 1. Query tiles (rows past the prompt zero).
            let qt = 3 * nks_d * TILE * KSTEP; // one query tile's elements
            for m in 0..QB {
                let at = m / TILE * qt + m % TILE * KSTEP;
                let part = nks_d * TILE * KSTEP;
                if m < nq {
                    let row = &q[(t0 + m) * width + hq * hd..][..hd];
                    for (l, &x) in qlow.iter_mut().zip(row) {
                        *l = x - bf16_to_f32(f32_to_bf16(x));
                    }
                    to_bf16_strided(row, &mut qa[at..], TILE * KSTEP);
                    to_bf16_strided(row, &mut qa[at + part..], TILE * KSTEP);
                    to_bf16_strided(qlow, &mut qa[at + 2 * part..], TILE * KSTEP);
                } else {
                    for st in 0..3 * nks_d {
                        qa[at + st * TILE * KSTEP..][..KSTEP].fill(0);
                    }
                }
            }
            // 2. Scores, key tile pairs.
            // Three k-passes in one stream: Qhi·Khi + Qhi·Klo + Qlo·Khi (the keys are
            // exact as hi + lo, the queries to ≈ 16 bits: scores of ±100 with bf16
            // operands alone moved SmolLM2's logits by a cosine of 1.4e-3).
            let kh = &kp[hk * head_words_k..(hk + 1) * head_words_k];
            for kpair in 0..ls / (2 * TILE) {
                let args = TileArgs {
                    a: [qa.as_ptr(), qa[qt..].as_ptr()],
                    b: [2 * kpair, 2 * kpair + 1].map(|kt| kh[kt * kt_words..].as_ptr()),
                    nks: 3 * nks_d,
                    c: c.as_mut_ptr(),
                };
                // SAFETY: query tiles hold 3 nks_d tiles per A tile, each key tile
                // 3 nks_d tiles (kt < lp / 16), C is 4 KiB; tiles configured for
                // `Step::Tiles`.
                unsafe { run_step(step, &args) };
                for i in 0..2 {
                    for j in 0..2 {
                        let tile = &c[(2 * i + j) * TILE * TILE..][..TILE * TILE];
                        for m in 0..TILE {
                            let row = (TILE * j + m) * lp + kpair * 2 * TILE + TILE * i;
                            s[row..row + TILE].copy_from_slice(&tile[m * TILE..][..TILE]);
                        }
                    }
                }
            }
            // 3. Softmax rows into probability tiles.
            let nks_k = ls / KSTEP;
            for m in 0..QB {
                let vis = if m < nq { pos0 + t0 + m + 1 } else { 0 };
                let p = &mut s[m * lp..m * lp + ls];
                let sum = softmax_row(p, vis, scale);
                inv[m] = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                for (l, &x) in plow.iter_mut().zip(p.iter()) {
                    *l = x - bf16_to_f32(f32_to_bf16(x));
                }
                let (te, st) = (TILE * KSTEP, 3 * TILE * KSTEP);
                let at = m / TILE * nks_k * st + m % TILE * KSTEP;
                to_bf16_strided(p, &mut pa[at..], st);
                to_bf16_strided(p, &mut pa[at + te..], st);
                to_bf16_strided(&plow[..ls], &mut pa[at + 2 * te..], st);
            }
            // 4. Outputs, dim tile pairs.
            // Three k-passes interleaved per key step: Phi·Vhi + Phi·Vlo + Plo·Vhi (the
            // values exact as hi + lo, the probabilities to ≈ 16 bits).
            let vh = &vp[hk * head_words_v..(hk + 1) * head_words_v];
            let steps = lp / KSTEP;
            for dpair in 0..hd / (2 * TILE) {
                let args = TileArgs {
                    a: [pa.as_ptr(), pa[3 * nks_k * TILE * KSTEP..].as_ptr()],
                    b: [2 * dpair, 2 * dpair + 1].map(|dt| vh[dt * steps * vs_words..].as_ptr()),
                    nks: 3 * nks_k,
                    c: c.as_mut_ptr(),
                };
                // SAFETY: probability tiles hold 3 nks_k tiles per A tile, each value dim
                // tile 3 steps >= 3 nks_k tiles, C is 4 KiB; tiles configured as above.
                unsafe { run_step(step, &args) };
                for i in 0..2 {
                    for j in 0..2 {
                        let tile = &c[(2 * i + j) * TILE * TILE..][..TILE * TILE];
                        for m in 0..TILE.min(nq.saturating_sub(TILE * j)) {
                            let col = (2 * dpair + i) * TILE;
                            let Some(dst) = rows
                                .get_mut(TILE * j + m)
                                .and_then(|r| r.get_mut(col..col + TILE))
                            else {
                                continue;
                            };
                            let r = inv[TILE * j + m];
                            for (o, &x) in dst.iter_mut().zip(&tile[m * TILE..][..TILE]) {
                                *o = x * r;
                            }
                        }
                    }
                }
            }
        };
        match pool {
            Some(p) if nt > 1 => p.for_each_task_with(units, &scratch, &work),
            _ => {
                let mut sc = scratch();
                for (i, unit) in units.into_iter().enumerate() {
                    work(i, unit, &mut sc);
                }
            }
        }
    });
    Ok(())
}

/// In place: `row[i] = exp(scale · (row[i] − max))` for `i < vis`, 0 beyond; returns the sum.
/// AVX-512F build where present.
fn softmax_row(row: &mut [f32], vis: usize, scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F is present.
        return unsafe { softmax_row_avx512(row, vis, scale) };
    }
    softmax_row_body(row, vis, scale)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row_avx512(row: &mut [f32], vis: usize, scale: f32) -> f32 {
    softmax_row_body(row, vis, scale)
}

#[inline(always)]
fn softmax_row_body(row: &mut [f32], vis: usize, scale: f32) -> f32 {
    let (seen, rest) = row.split_at_mut(vis.min(row.len()));
    rest.fill(0.0);
    let mx = seen.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for x in seen.iter_mut() {
        *x = exp_fast(scale * (*x - mx));
        sum += *x;
    }
    sum
}

/// One thread's phase-2 buffers, reused across its units.
struct Phase2 {
    /// The tile configuration, held while the thread runs units (tile path only).
    _tiles: Option<TileGuard>,
    /// `[2][3][hd / 32][16][32]` bf16 query tiles (hi, hi, lo).
    qa: Vec<u16>,
    /// `[hd]` one query's residuals.
    qlow: Vec<f32>,
    /// `[32, lp]` f32 scores.
    s: Vec<f32>,
    /// `[2][lp / 32][3][16][32]` bf16 probabilities per step: hi, hi, lo (× V hi, lo, hi).
    pa: Vec<u16>,
    /// `[lp]` one row's residuals.
    plow: Vec<f32>,
    /// 1 / Σp per query.
    inv: [f32; QB],
    /// `[4][16][16]` f32 C tiles.
    c: [f32; 4 * TILE * TILE],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_decode::KvLayout;
    use crate::attn_prefill::tests::check_against_decode;

    fn check(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        pos0: usize,
        n_tokens: usize,
        threads: usize,
    ) {
        let pool = ThreadPool::new(threads);
        let mut steps = vec![Step::Emulated];
        if is_available(hd) {
            steps.push(Step::Tiles);
        }
        for step in steps {
            // hi + lo bf16 splits: within f32-like rounding of the f16 cache.
            check_against_decode(
                n_head,
                n_head_kv,
                hd,
                pos0,
                n_tokens,
                2e-5,
                &format!("{step:?}"),
                |q, k, v, shape, pos0, out| {
                    run(step, q, k, v, shape, pos0, out, Some(&pool)).unwrap()
                },
            );
        }
    }

    #[test]
    fn matches_per_token_decode_on_awkward_sizes() {
        for &(nt, pos0) in &[(1, 0), (3, 0), (7, 5), (33, 0), (17, 70), (130, 3)] {
            check(6, 2, 64, pos0, nt, 1);
        }
        check(4, 4, 64, 0, 33, 3);
        check(9, 3, 128, 60, 100, 2);
        check(3, 1, 128, 1023, 7, 2);
        check(2, 1, 96, 0, 40, 2); // head_dim 96: three k-steps, three dim-tile pairs
        check(9, 3, 64, 0, 40, 1); // SmolLM2's heads on one thread
    }

    #[test]
    fn rejects_bad_shapes() {
        let shape = DecodeShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            layout: KvLayout::HeadMajor { n_ctx: 4 },
        };
        let (k, v) = (vec![0u16; 4 * 64], vec![0u16; 4 * 64]);
        let q = vec![0f32; 128 * 3];
        let mut out = vec![0f32; 128 * 3];
        let e = Step::Emulated;
        assert!(run(e, &q, &k, &v, shape, 2, &mut out, None).is_err()); // past n_ctx
        assert!(run(e, &q[..7], &k, &v, shape, 0, &mut out[..7], None).is_err());
        let pm = DecodeShape {
            layout: KvLayout::PosMajor,
            ..shape
        };
        assert!(run(e, &q, &k, &v, pm, 0, &mut out, None).is_err());
        let odd = DecodeShape {
            head_dim: 48,
            ..shape
        };
        assert!(run(e, &q, &k, &v, odd, 0, &mut out, None).is_err());
    }
}
