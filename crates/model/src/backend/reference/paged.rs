//! [`Backend::attention_batch`](crate::backend::Backend::attention_batch) on the reference
//! backend: the layer caches (`[n_slots, n_head_kv, head_dim]` f32) are the pool; each
//! sequence's keys and values are written into its slots and its positions gathered back in
//! order (a private cache, whose blocks are the first ones in order, is read in place), then
//! the reference attention runs per sequence, exactly as for a sequence alone.

use damascus_kernels::reference as k;

use super::{HostAct, HostKvCache, check_len};
use crate::backend::{AttnSpec, PagedBatch, RopeParams};
use crate::error::ModelError;

/// See [`crate::backend::Backend::attention_batch`].
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_batch(
    cache: &mut HostKvCache,
    layer: usize,
    attn: AttnSpec,
    rope: &RopeParams,
    batch: &PagedBatch<'_>,
    q: &mut HostAct,
    kk: &mut HostAct,
    v: &HostAct,
    out: &mut HostAct,
) -> Result<(), ModelError> {
    let shape = attn.shape;
    let hd = shape.head_dim;
    let q_width = shape.n_head * hd;
    let kv_width = cache.shape.n_head_kv * hd;
    let n_slots = cache.shape.n_ctx;
    let bs = batch.block_size;
    let n_tokens = q.n_tokens;
    check_len("attention", "q row", q.width, q_width)?;
    check_len("attention", "k", kk.data.len(), n_tokens * kv_width)?;
    check_len("attention", "v", v.data.len(), n_tokens * kv_width)?;
    check_len("attention", "out", out.data.len(), q.data.len())?;
    let (kc, vc) = match (cache.k.get_mut(layer), cache.v.get_mut(layer)) {
        (Some(kc), Some(vc)) => (kc, vc),
        _ => {
            return Err(ModelError::Tensor {
                what: format!("attention: no cache for layer {layer}"),
            });
        }
    };
    let n_blocks = n_slots / bs.max(1);
    let cache_type = cache.shape.cache_type;
    let mut covered = 0;
    let (mut kg, mut vg) = (Vec::new(), Vec::new());
    for s in batch.seqs {
        let n = s.rows.len();
        let end = s.pos0 + n;
        if bs == 0
            || s.rows.start != covered
            || s.rows.end > n_tokens
            || end.div_ceil(bs) > s.table.len()
            || s.table.iter().any(|&b| b as usize >= n_blocks)
        {
            return Err(ModelError::Tensor {
                what: format!(
                    "attention: sequence rows {:?} at {} with {} blocks of {bs} (pool of {n_blocks})",
                    s.rows,
                    s.pos0,
                    s.table.len()
                ),
            });
        }
        covered = s.rows.end;
        let qr = &mut q.data[s.rows.start * q_width..s.rows.end * q_width];
        k::rope(qr, shape.n_head, hd, s.pos0, &rope.inv_freq, rope.layout);
        let kr = &mut kk.data[s.rows.start * kv_width..s.rows.end * kv_width];
        k::rope(kr, shape.n_head_kv, hd, s.pos0, &rope.inv_freq, rope.layout);
        let slot = |p: usize| s.table[p / bs] as usize * bs + p % bs;
        for t in 0..n {
            let dst = slot(s.pos0 + t) * kv_width;
            let src = (s.rows.start + t) * kv_width;
            kc[dst..dst + kv_width].copy_from_slice(&kk.data[src..src + kv_width]);
            vc[dst..dst + kv_width].copy_from_slice(&v.data[src..src + kv_width]);
            super::store_rounding(cache_type, &mut kc[dst..dst + kv_width])?;
            super::store_rounding(cache_type, &mut vc[dst..dst + kv_width])?;
        }
        let o = &mut out.data[s.rows.start * q_width..s.rows.end * q_width];
        let qr = &q.data[s.rows.start * q_width..s.rows.end * q_width];
        if s.table.iter().enumerate().all(|(i, &b)| b as usize == i) {
            let valid = end * kv_width;
            k::attention_window(
                qr,
                &kc[..valid],
                &vc[..valid],
                shape,
                s.pos0,
                attn.window,
                o,
            );
        } else {
            kg.clear();
            vg.clear();
            for p in 0..end {
                let at = slot(p) * kv_width;
                kg.extend_from_slice(&kc[at..at + kv_width]);
                vg.extend_from_slice(&vc[at..at + kv_width]);
            }
            k::attention_window(qr, &kg, &vg, shape, s.pos0, attn.window, o);
        }
    }
    if covered != n_tokens {
        return Err(ModelError::Tensor {
            what: format!("attention: sequences cover {covered} of {n_tokens} rows"),
        });
    }
    Ok(())
}
