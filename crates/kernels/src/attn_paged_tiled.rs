//! Tiled attention over the paged KV cache: a run of consecutive query tokens of one sequence
//! (a prompt chunk) against that sequence's keys and values, all query heads of a KV head
//! together, so each key and value row is loaded once per tile instead of once per token.
//!
//! Each token's arithmetic is exactly the per-token kernel's ([`crate::attn_paged`]): every
//! score is the same dot product (the same two 8-lane accumulators over the same 16-element
//! steps, the same horizontal sum, then the scalar tail), every softmax row is the same
//! function over the token's own visible positions, and every output element accumulates
//! `w·v` over those positions in ascending order from zero with the same fused multiply-add.
//! Only the loop order across tokens, heads and positions changes, so the result is bit for
//! bit the per-token kernel's: a token's attention still does not depend on how its prompt
//! was chunked or batched. Without SIMD every token goes through the per-token scalar kernel
//! (the twin).
//!
//! Two bodies: AVX-512 (`avx512`: register-blocked 4 rows × 4 keys and 4 rows × 64 columns on
//! K/V rows widened once per tile; head sizes that are multiples of 16) and AVX2 (`avx2`:
//! every other head size, and CPUs or levels without AVX-512).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(test)]
mod tests;

use crate::attn_kv::{F16Rows, KvRows};
use crate::attn_paged::{PagedQuery, PagedShape, kv_head};
use crate::pool::{ThreadPool, pieces};
use crate::quantdot::{Isa, KernelError, kernels};

/// Most tokens in one tile, and the target size in bytes of a tile's score buffer
/// (`[tokens · group, positions]` f32), per body: the AVX-512 body widens each tile's K/V rows
/// once, so larger tiles share that work more.
const fn tile_limits(body: Body) -> (usize, usize) {
    match body {
        Body::Avx512 => (32, 512 << 10),
        _ => (16, 256 << 10),
    }
}

/// A thread's buffers for the tiles it runs (reused from tile to tile; every element a tile
/// reads it wrote first).
#[derive(Debug, Default)]
struct TileScratch {
    /// The tile's query rows of one KV head, `[tokens · group, head_dim]` (64-byte aligned).
    q: Vec<f32>,
    /// A block of widened key or value rows, `[block, head_dim]`.
    rows: Vec<f32>,
    /// Scores, then weights, `[tokens · group, positions]`.
    scores: Vec<f32>,
    /// Element offsets of the tile's positions in the pools.
    slots: Vec<usize>,
}

/// A tile: queries `start..end` (one sequence, one table), visible positions `lo..hi` (the
/// union of the tokens' ranges).
#[derive(Clone, Copy, Debug)]
struct Tile {
    start: usize,
    end: usize,
    lo: usize,
    hi: usize,
}

/// Attention of every query token over its own sequence's blocks, tiled: same arguments and
/// result as [`crate::attn_paged::attn_paged_f16_per_token`] (bit for bit).
///
/// * `queries`: one per token, `q` `[queries.len(), n_head, head_dim]` f32 (rotated)
/// * `k`, `v`: the pools, f16 bits `[n_head_kv, n_slots, head_dim]`
/// * `out`: `[queries.len(), n_head, head_dim]` f32
pub fn attn_paged_f16_tiled(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    attn_paged_tiled(queries, q, F16Rows(k), F16Rows(v), shape, out, pool)
}

/// [`attn_paged_f16_tiled`] with its body chosen for ISA level `isa` (at most the CPU's):
/// every level gives the same bits. For tests and benchmarks of the bodies side by side.
#[allow(clippy::too_many_arguments)]
pub fn attn_paged_f16_tiled_at(
    isa: Isa,
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    tiled_at(isa, queries, q, F16Rows(k), F16Rows(v), shape, out, pool)
}

/// [`attn_paged_f16_tiled`] over any pool element type (f16, q8_0): the same arithmetic on the
/// exactly widened values.
pub(crate) fn attn_paged_tiled<R: KvRows>(
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    tiled_at(kernels().isa(), queries, q, k, v, shape, out, pool)
}

/// The body a tile runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// The per-token scalar kernel, token by token.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512.
    Avx512,
}

#[allow(clippy::too_many_arguments)]
fn tiled_at<R: KvRows>(
    isa: Isa,
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
    let body = if isa >= Isa::Avx512 && Isa::Avx512.is_available() && avx512::supports(&shape) {
        Body::Avx512
    } else if isa >= Isa::Avx2 && Isa::Avx2.is_available() {
        Body::Avx2
    } else {
        Body::Scalar
    };
    #[cfg(not(target_arch = "x86_64"))]
    let body = {
        let _ = isa;
        Body::Scalar
    };
    let group = shape.n_head / shape.n_head_kv;
    let tiles = tiles(queries, group, tile_limits(body));
    let n_units = tiles.len() * shape.n_head_kv;
    let span = group * shape.head_dim;
    // Unit (tile, KV head) owns, for each token of its tile, the output columns of the KV
    // head's query heads: `out` cut into `[span]` pieces, piece t·n_head_kv + kvh. Heaviest
    // tiles (latest positions) first.
    let mut rows = pieces(out, span);
    let units: Vec<(Tile, usize, Vec<&mut [f32]>)> = (0..n_units)
        .rev()
        .map(|u| {
            let (tile, kvh) = (tiles[u / shape.n_head_kv], u % shape.n_head_kv);
            let outs = (tile.start..tile.end)
                .filter_map(|t| rows[t * shape.n_head_kv + kvh].take())
                .collect();
            (tile, kvh, outs)
        })
        .collect();
    type Unit<'o> = (Tile, usize, Vec<&'o mut [f32]>);
    let unit = |_: usize, (tile, kvh, mut outs): Unit<'_>, scratch: &mut TileScratch| {
        tile_kv_head(
            body, &tile, queries, q, k, v, shape, kvh, &mut outs, scratch,
        );
    };
    match pool.filter(|p| p.n_threads() > 1 && n_units > 1) {
        Some(pool) => pool.for_each_task_with(units, &TileScratch::default, &unit),
        None => {
            let mut scratch = TileScratch::default();
            for (i, u) in units.into_iter().enumerate() {
                unit(i, u, &mut scratch);
            }
        }
    }
    Ok(())
}

/// Cuts `queries` into tiles of consecutive tokens sharing a block table and a scale.
fn tiles(
    queries: &[PagedQuery<'_>],
    group: usize,
    (max_tile, score_bytes): (usize, usize),
) -> Vec<Tile> {
    let mut tiles: Vec<Tile> = Vec::new();
    for (i, pq) in queries.iter().enumerate() {
        if let Some(t) = tiles.last_mut() {
            let first = &queries[t.start];
            let (lo, hi) = (t.lo.min(pq.lo), t.hi.max(pq.hi));
            let same = std::ptr::eq(first.table, pq.table) && first.scale == pq.scale;
            let n = i + 1 - t.start;
            if same && n <= max_tile && n * group * (hi - lo) * 4 <= score_bytes {
                *t = Tile {
                    end: i + 1,
                    lo,
                    hi,
                    ..*t
                };
                continue;
            }
        }
        tiles.push(Tile {
            start: i,
            end: i + 1,
            lo: pq.lo,
            hi: pq.hi,
        });
    }
    tiles
}

/// One tile against KV head `kvh`: writes `outs`, one `[group, head_dim]` row per token of
/// the tile (its columns `kvh·group·head_dim..` of `[queries.len(), n_head, head_dim]`).
#[allow(clippy::too_many_arguments)]
fn tile_kv_head<R: KvRows>(
    body: Body,
    tile: &Tile,
    queries: &[PagedQuery<'_>],
    q: &[f32],
    k: R,
    v: R,
    shape: PagedShape,
    kvh: usize,
    outs: &mut [&mut [f32]],
    scratch: &mut TileScratch,
) {
    let group = shape.n_head / shape.n_head_kv;
    let span = group * shape.head_dim;
    let width = shape.n_head * shape.head_dim;
    #[cfg(target_arch = "x86_64")]
    if body != Body::Scalar {
        let qs = &queries[tile.start..tile.end];
        let qrows = &q[tile.start * width..tile.end * width];
        if body == Body::Avx512 {
            // SAFETY: `Avx512` is only chosen when AVX-512 (with AVX2+FMA+F16C) was detected
            // and `avx512::supports(shape)`; the shapes were checked.
            unsafe { avx512::tile(qs, tile.lo, tile.hi, qrows, k, v, shape, kvh, outs, scratch) };
        } else {
            // SAFETY: `Avx2` is only chosen when AVX2+FMA+F16C were detected.
            unsafe { avx2::tile(qs, tile.lo, tile.hi, qrows, k, v, shape, kvh, outs) };
        }
        return;
    }
    for (t, out) in (tile.start..tile.end).zip(outs.iter_mut()) {
        let qg = &q[t * width + kvh * span..][..span];
        kv_head(
            false,
            qg,
            k,
            v,
            shape,
            &queries[t],
            kvh,
            out,
            &mut scratch.scores,
        );
    }
}
