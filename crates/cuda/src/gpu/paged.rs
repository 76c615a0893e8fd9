//! Batched passes over a shared paged KV pool (the server's continuous batching): the layer
//! caches of a [`DevKv`] are the pool (`n_kv` head regions of `n_ctx` rows per layer, f16 or
//! q8_0, its `n_ctx` slots cut into blocks of `block_size`), every sequence of the pass has its own positions
//! and block table, and every row attends over its own sequence's slots.
//!
//! One batch table per pass (`kernels/paged.cu` spells out its layout: per-row positions,
//! slots and table offsets, the decode rows, the block tables) goes to the device with the
//! token ids at the flush, so a pass of decode rows only replays as a graph from its second
//! step at that batch size, as a lone sequence's step does; other batched passes run eager.
//! Decode rows (sequences with one row in the pass) run the split-K decode kernel, each with
//! the split length it would have alone; prompt chunks run the flash kernel (or the CUDA-core
//! one when flash is off) once per chunk. Only the address of a cached position differs from a
//! lone sequence's kernels, so a row's result does not depend on the rows around it.

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::Gpu;
use super::attention::{
    AD_THREADS, ATT_THREADS, AttnParams, FA_ROWS, FA_THREADS, attn_decode_smem, decode_chunk,
    flash_smem,
};
use super::buffers::{DevAct, DevKv, DevVec, MAX_GROUP};
use super::launch::{
    AttnCombinePaged, AttnDecodePaged, AttnFlashPaged, AttnPrefillPaged, AttnSplitPaged, Ptr,
    RopeKvPaged, attn_variant, head_variant,
};
use super::ops::div_ceil_u32;
use super::recorder::Op;
use crate::error::CudaError;

/// One sequence of a batched pass.
#[derive(Clone, Debug)]
pub struct PagedSeq<'a> {
    /// Its rows of the activations (consecutive, in sequence order).
    pub rows: Range<usize>,
    /// Position of its first row (positions `0..pos0` are already cached).
    pub pos0: usize,
    /// Its block table: position `p` lives in slot `table[p / block_size] * block_size +
    /// p % block_size`; covers `pos0 + rows.len()` positions.
    pub table: &'a [u32],
}

/// Decode splits a query at any depth up to `n_ctx` positions can need:
/// `max(ceil(n / decode_chunk(n)))` over `n` in `1..=n_ctx`. A one-row pass sizes its grid by
/// this (not by its own depth), so its graph replays unchanged as the sequence grows.
pub fn decode_splits_bound(n_ctx: usize) -> usize {
    // ceil(n / decode_chunk(n)) grows with n while the chunk stays the same, so the largest
    // value is at n_ctx or at the last n of a chunk length: n / 64 <= c, n = 64 (c + 1) - 1.
    [32, 64, 128]
        .iter()
        .map(|&c| (64 * (c + 1) - 1).min(n_ctx))
        .chain([n_ctx])
        .map(|n| n.div_ceil(decode_chunk(n.max(1))))
        .max()
        .unwrap_or(0)
}

/// The decode splits a graphed pass launches for rows that need at most `need` splits, in a
/// pool of `n_ctx` positions: `need` rounded up to a power of two, but never past what the
/// pool's deepest position needs ([`decode_splits_bound`]), and never under `need`. The
/// combine reads only each row's own splits, so the extra blocks change no result.
fn graph_splits(need: usize, n_ctx: usize) -> usize {
    need.max(1)
        .next_power_of_two()
        .min(decode_splits_bound(n_ctx))
        .max(need)
}

/// Most bytes of decode partials a graphed batch may hold (its splits are sized for the
/// pool's deepest position, not its own).
const GRAPH_PARTIALS: usize = 64 << 20;

fn shape_err(what: String) -> CudaError {
    CudaError::Shape(format!("paged attention: {what}"))
}

/// The batch table of a pass (see `kernels/paged.cu`) and where its pieces start.
struct BatchTable {
    /// `pos [n] | slot [n] | tab [n] | list [n_dec] | block tables`.
    words: Vec<u32>,
    /// The decode rows.
    n_dec: usize,
    /// Most decode splits a decode row of this pass needs.
    max_splits: usize,
    /// Where each sequence's block table starts in `words`.
    tab_off: Vec<usize>,
}

/// Checks `seqs` against `n` rows and a pool of `n_ctx` slots in blocks of `bs`, and builds
/// the batch table.
fn batch_table(
    seqs: &[PagedSeq<'_>],
    n: usize,
    bs: usize,
    n_ctx: usize,
) -> Result<BatchTable, CudaError> {
    if bs == 0 || !n_ctx.is_multiple_of(bs) {
        return Err(shape_err(format!(
            "blocks of {bs} slots in a pool of {n_ctx}"
        )));
    }
    let n_blocks = n_ctx / bs;
    let n_dec = seqs.iter().filter(|s| s.rows.len() == 1).count();
    let head = 3 * n + n_dec;
    let mut words = vec![0u32; head];
    let mut tab_off = Vec::with_capacity(seqs.len());
    let mut covered = 0;
    let mut dec = 3 * n;
    let mut max_splits = 0;
    for (i, s) in seqs.iter().enumerate() {
        let end = s.pos0 + s.rows.len();
        let used = end.div_ceil(bs);
        if s.rows.start != covered
            || s.rows.is_empty()
            || s.rows.end > n
            || used > s.table.len()
            || i32::try_from(end).is_err()
        {
            return Err(shape_err(format!(
                "sequence {i}: rows {:?} of {n} (after row {covered}) at position {} with {} \
                 blocks of {bs}",
                s.rows,
                s.pos0,
                s.table.len()
            )));
        }
        let table = &s.table[..used];
        if let Some(&b) = table.iter().find(|&&b| b as usize >= n_blocks) {
            return Err(shape_err(format!(
                "sequence {i} names block {b} of {n_blocks}"
            )));
        }
        covered = s.rows.end;
        let off = words.len();
        tab_off.push(off);
        for (t, row) in s.rows.clone().enumerate() {
            let p = s.pos0 + t;
            words[row] = p as u32;
            words[n + row] = (table[p / bs] as usize * bs + p % bs) as u32;
            words[2 * n + row] = off as u32;
        }
        if s.rows.len() == 1 {
            words[dec] = s.rows.start as u32;
            dec += 1;
            max_splits = max_splits.max(end.div_ceil(decode_chunk(end)));
        }
        words.extend_from_slice(table);
    }
    if covered != n {
        return Err(shape_err(format!("sequences cover {covered} of {n} rows")));
    }
    if u32::try_from(words.len()).is_err() {
        return Err(shape_err(format!("a batch table of {} words", words.len())));
    }
    Ok(BatchTable {
        words,
        n_dec,
        max_splits,
        tab_off,
    })
}

impl Gpu {
    /// The attention of a batched pass over the paged pool `kv` (`n_ctx` slots in blocks of
    /// `block_size`): for every sequence of `seqs`, its rows of `k` (rotated at their own
    /// positions when `rope = Some((inv_freq, neox))`, which rotates `q` in place too) and
    /// `v` written into its slots of `layer`, then causal GQA attention of each of its rows
    /// over its own positions into `out`, with `params`' scale and window. `q`, `out`
    /// `[n, n_head * head_dim]`, `k`, `v` `[n, n_kv * head_dim]`, the sequences' rows
    /// covering `0..n` in order.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_paged(
        &self,
        kv: &mut DevKv,
        layer: usize,
        block_size: usize,
        seqs: &[PagedSeq<'_>],
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
        rope: Option<(&DevVec, bool)>,
        params: AttnParams,
    ) -> Result<(), CudaError> {
        let (hd, n_kv, n_head) = (kv.head_dim, kv.n_kv, kv.n_head);
        let n = q.n;
        if layer >= kv.n_layer
            || q.width != n_head * hd
            || k.width != n_kv * hd
            || v.width != n_kv * hd
            || k.n != n
            || v.n != n
            || out.n != n
            || out.width != q.width
        {
            return Err(shape_err(format!(
                "layer {layer} of {}, q [{n}, {}], k [{}, {}], v [{}, {}], out [{}, {}] for \
                 {n_head} heads, {n_kv} KV heads of {hd}",
                kv.n_layer, q.width, k.n, k.width, v.n, v.width, out.n, out.width
            )));
        }
        let (half, inv, neox) = match rope {
            Some((inv, neox)) => (inv.n, inv.buf.ptr, neox),
            None => (0, Ptr::NULL, false),
        };
        if 2 * half > hd {
            return Err(shape_err(format!(
                "{half} rope frequencies for head_dim {hd}"
            )));
        }
        let variant = head_variant(hd).ok_or_else(|| shape_err(format!("head_dim {hd}")))?;
        // The cache-reading kernels' variant (head size and element type).
        let kvv = attn_variant(hd, kv.elem)
            .ok_or_else(|| shape_err(format!("head_dim {hd} with a {:?} cache", kv.elem)))?;
        let group = n_head / n_kv;
        debug_assert!((1..=MAX_GROUP).contains(&group));
        let window = i32::try_from(params.window)
            .map_err(|_| shape_err(format!("window {}", params.window)))?;
        let scale = params.scale.unwrap_or(1.0 / (hd as f32).sqrt());
        let bt = batch_table(seqs, n, block_size, kv.n_ctx)?;
        // A pass of decode rows only is graphed (see the recorder) when its matmuls are
        // graphable: the GEMVs, MMQ, or cuBLAS with `gemm_graphs`. Its launches must then not
        // change from step to step, so it takes the splits of a power-of-two bucket over its
        // rows' deepest need (`graph_splits`): a graph is captured once per bucket, not once
        // per step, and a shallow batch in a deep pool does not pay for the pool's depth. The
        // partials must stay under `GRAPH_PARTIALS`; other passes take what their rows need.
        let bucket = graph_splits(bt.max_splits, kv.n_ctx);
        let graphed = bt.n_dec == n
            && (self.gemv_takes(n)
                || self.mmq_takes(n)
                || self.gemm_graphs.load(Ordering::Relaxed))
            && n * n_head * bucket * (hd * 4 + 8) <= GRAPH_PARTIALS;
        let n_split = if graphed { bucket } else { bt.max_splits };
        if n_split > 65535 || bt.n_dec > 65535 {
            return Err(shape_err(format!(
                "{} decode rows of {n_split} splits",
                bt.n_dec
            )));
        }
        let bat = {
            let mut r = self.rec();
            if r.batch_host != bt.words {
                if !r.batch_host.is_empty() {
                    // Ops recorded in this pass read the current table: run them first.
                    self.flush(&mut r, false)?;
                }
                if r.batch.as_ref().is_none_or(|b| b.len < 4 * bt.words.len()) {
                    r.batch = Some(self.alloc(4 * bt.words.len().next_power_of_two())?);
                    Self::forget_graphs(&mut r);
                }
                r.batch_host.clone_from(&bt.words);
                r.batch_dirty = true;
            }
            r.decode_batch = graphed;
            r.batch.as_ref().map_or(Ptr::NULL, |b| b.ptr)
        };
        // The decode rows' partials (grown only on a pass's first layer: every layer of a
        // pass has the same batch, and a new batch flushed the pass above).
        let part_o_bytes = bt.n_dec * n_head * n_split * hd * 4;
        let part_ml_bytes = bt.n_dec * n_head * n_split * 8;
        if kv
            .paged_part
            .as_ref()
            .is_none_or(|(o, ml)| o.len < part_o_bytes || ml.len < part_ml_bytes)
        {
            kv.paged_part = Some((
                self.alloc(part_o_bytes.next_power_of_two())?,
                self.alloc(part_ml_bytes.next_power_of_two())?,
            ));
        }
        let (part_o, part_ml) = kv
            .paged_part
            .as_ref()
            .map_or((Ptr::NULL, Ptr::NULL), |(o, ml)| (o.ptr, ml.ptr));

        let layer_off = layer * kv.layer_bytes();
        let (kc, vc) = (kv.k.ptr.at(layer_off), kv.v.ptr.at(layer_off));
        let total = n * (n_head + n_kv) * hd / 2;
        self.push(
            RopeKvPaged {
                variant: kv.elem as usize,
                q: q.x.ptr,
                k: k.x.ptr,
                v: v.x.ptr,
                kc,
                vc,
                pos: bat,
                slot: bat.at(4 * n),
                inv_freq: inv,
                n_tok: n as i32,
                n_head: n_head as i32,
                n_kv: n_kv as i32,
                head_dim: hd as i32,
                half: half as i32,
                neox,
                n_ctx: kv.n_ctx as i32,
            },
            [div_ceil_u32(total, 256), 1, 1],
            [256, 1, 1],
        );
        if half > 0 {
            q.q_fresh.store(false, Ordering::Relaxed);
        }
        // The combine quantizes whole warps of one head: a head under 32 dims leaves the
        // shadow stale (re-made from f32 by the next GEMV).
        let do_q = out.q.is_some() && hd >= 32;
        if bt.n_dec > 0 {
            let split = AttnSplitPaged {
                variant: kvv,
                q: q.x.ptr,
                kc,
                vc,
                bat,
                part_o,
                part_ml,
                n_head: n_head as i32,
                group: group as i32,
                n_ctx: kv.n_ctx as i32,
                n_split: n_split as i32,
                scale,
                window,
                bs: block_size as i32,
                n_tok: n as i32,
            };
            let grid = [n_kv as u32, n_split as u32, bt.n_dec as u32];
            // The streamed kernel where it serves this head size (the same splits and
            // partials, so a row keeps the bits it gets alone), else the split kernel.
            match self.attn_v2_variant(hd, kv.elem) {
                Some(v) => self.push_smem(
                    AttnDecodePaged {
                        variant: v,
                        q: split.q,
                        kc,
                        vc,
                        bat,
                        part_o,
                        part_ml,
                        n_head: split.n_head,
                        group: split.group,
                        n_ctx: split.n_ctx,
                        n_split: split.n_split,
                        scale,
                        window,
                        bs: split.bs,
                        n_tok: split.n_tok,
                    },
                    grid,
                    [AD_THREADS, 1, 1],
                    attn_decode_smem(hd),
                ),
                None => self.push(split, grid, [ATT_THREADS, 1, 1]),
            }
            let (oq, ods) = out.q8_ptrs();
            self.push(
                AttnCombinePaged {
                    variant,
                    part_o,
                    part_ml,
                    bat,
                    out: out.x.ptr,
                    q: oq,
                    ds: ods,
                    n_head: n_head as i32,
                    n_split: n_split as i32,
                    do_q,
                    window,
                    n_tok: n as i32,
                },
                [n_head as u32, bt.n_dec as u32, 1],
                [hd as u32, 1, 1],
            );
        }
        let flash = self.flash_enabled.load(Ordering::Relaxed);
        for (s, &off) in seqs.iter().zip(&bt.tab_off) {
            let len = s.rows.len();
            if len == 1 {
                continue;
            }
            let row_q = q.x.ptr.at(s.rows.start * q.width * 4);
            let row_out = out.x.ptr.at(s.rows.start * out.width * 4);
            let inputs = bat.at(4 * s.rows.start);
            let table = bat.at(4 * off);
            if flash {
                let tiles = div_ceil_u32(len * group, FA_ROWS);
                if tiles > 65535 {
                    return Err(shape_err(format!("a prompt chunk of {len} rows")));
                }
                self.push_smem(
                    AttnFlashPaged {
                        variant: kvv,
                        q: row_q,
                        kc,
                        vc,
                        inputs,
                        table,
                        bs: block_size as i32,
                        out: row_out,
                        n_tok: len as i32,
                        n_head: n_head as i32,
                        group: group as i32,
                        n_ctx: kv.n_ctx as i32,
                        scale,
                        window,
                    },
                    [n_kv as u32, tiles, 1],
                    [FA_THREADS, 1, 1],
                    flash_smem(hd),
                );
            } else {
                self.push(
                    AttnPrefillPaged {
                        variant: kvv,
                        q: row_q,
                        kc,
                        vc,
                        inputs,
                        table,
                        bs: block_size as i32,
                        out: row_out,
                        n_tok: len as i32,
                        n_head: n_head as i32,
                        group: group as i32,
                        n_ctx: kv.n_ctx as i32,
                        scale,
                        window,
                    },
                    [n_kv as u32, div_ceil_u32(len, 4), 1],
                    [128, 1, 1],
                );
            }
        }
        // The shadow is current only when the combine wrote every row.
        out.q_fresh.store(do_q && bt.n_dec == n, Ordering::Relaxed);
        Ok(())
    }

    /// Copies rows `rows` of `src` `[n, width]` into `dst` `[rows.len(), width]` (runs of
    /// consecutive rows in one copy).
    pub fn copy_rows(&self, src: &DevAct, rows: &[usize], dst: &DevAct) -> Result<(), CudaError> {
        if dst.n != rows.len() || dst.width != src.width || rows.iter().any(|&r| r >= src.n) {
            return Err(CudaError::Shape(format!(
                "copy_rows: rows {rows:?} of [{}, {}] into [{}, {}]",
                src.n, src.width, dst.n, dst.width
            )));
        }
        let bytes = src.width * 4;
        let mut r = self.rec();
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[i] + (j - i) {
                j += 1;
            }
            r.ops.push(Op::Copy {
                dst: dst.x.ptr.at(i * bytes),
                src: src.x.ptr.at(rows[i] * bytes),
                bytes: (j - i) * bytes,
            });
            i = j;
        }
        dst.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_bound_is_the_largest_split_count_up_to_n_ctx() {
        let mut best = 0;
        for n in 1..=20_000usize {
            best = best.max(n.div_ceil(decode_chunk(n)));
            assert_eq!(decode_splits_bound(n), best, "n_ctx {n}");
        }
        assert_eq!(decode_splits_bound(0), 0);
        // Graphed passes: a power-of-two bucket over the need, within the pool's bound.
        let bound = decode_splits_bound(24_576);
        assert_eq!(bound, 96);
        for (need, want) in [
            (0, 1),
            (1, 1),
            (3, 4),
            (17, 32),
            (33, 64),
            (65, 96),
            (96, 96),
        ] {
            assert_eq!(graph_splits(need, 24_576), want, "need {need}");
        }
        assert_eq!(graph_splits(130, 24_576), 130);
        assert_eq!(decode_splits_bound(1 << 20), (1 << 20) / 256);
    }

    #[test]
    fn batch_table_layout_and_checks() {
        // Rows 0..3: a prompt chunk at positions 5..8 of blocks [2, 0]; row 3: a decode row at
        // position 4 of blocks [1, 3]. Blocks of 4 slots, 16 slots.
        let (t0, t1) = ([2u32, 0], [1u32, 3, 9]);
        let seqs = [
            PagedSeq {
                rows: 0..3,
                pos0: 5,
                table: &t0,
            },
            PagedSeq {
                rows: 3..4,
                pos0: 4,
                table: &t1,
            },
        ];
        let bt = batch_table(&seqs, 4, 4, 16).unwrap();
        assert_eq!(bt.n_dec, 1);
        assert_eq!(bt.max_splits, 1);
        assert_eq!(bt.tab_off, vec![13, 15]);
        #[rustfmt::skip]
        assert_eq!(
            bt.words,
            vec![
                5, 6, 7, 4, // pos
                1, 2, 3, 12, // slot
                13, 13, 13, 15, // tab
                3, // decode rows
                2, 0, // table of sequence 0
                1, 3, // sequence 1 (only the blocks it uses)
            ]
        );
        // Gaps, overlaps, short tables and foreign blocks are errors, not panics.
        let bad = |seqs: &[PagedSeq<'_>], n: usize| batch_table(seqs, n, 4, 16).is_err();
        assert!(bad(&seqs, 5));
        assert!(bad(&seqs[1..], 1));
        let short = [PagedSeq {
            rows: 0..2,
            pos0: 7,
            table: &t0[..1],
        }];
        assert!(bad(&short, 2));
        let foreign = [PagedSeq {
            rows: 0..1,
            pos0: 0,
            table: &[4],
        }];
        assert!(bad(&foreign, 1));
        assert!(batch_table(&seqs, 4, 0, 16).is_err());
        assert!(batch_table(&seqs, 4, 3, 16).is_err());
    }
}
