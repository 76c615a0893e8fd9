//! [`Backend::attention_batch`](crate::backend::Backend::attention_batch) on the CPU: the
//! layer caches are the pool (`[n_head_kv, n_slots, head_dim]`, blocks of `block_size` slots),
//! every sequence's rows are rotated at their own positions and written into their own slots,
//! then every token attends over its own sequence's positions through one kernel,
//! [`damascus_kernels::attn_paged`], whatever the number of tokens: a token's result never
//! depends on the batch around it or on how its prefix was computed.

use std::sync::Arc;

use damascus_kernels::attn_group::attn_paged_f16_grouped;
use damascus_kernels::attn_kv::{Q8Rows, quantize_q8_0};
use damascus_kernels::attn_paged::{PagedQuery, PagedShape, attn_paged_f16};
use damascus_kernels::attn_paged_q8::{attn_paged_q8, attn_paged_q8_grouped};
use damascus_kernels::hugebuf::HugeBuf;
use damascus_kernels::reference as k;

use super::{CpuBackend, CpuKvCache, KvStore, dot_f32, kernel_err};
use crate::backend::reference::{HostAct, check_len};
use crate::backend::{AttnSpec, KvShape, PagedBatch, RopeParams};
use crate::error::ModelError;

/// One layer's keys (or values) in q8_0: the i8 values and one f16 scale per 32 of them.
#[derive(Debug)]
pub(super) struct Q8Layer {
    /// `[n_head_kv, n_ctx, head_dim]` quantized values.
    qs: HugeBuf<i8>,
    /// `[n_head_kv, n_ctx, head_dim / 32]` f16 bits: the scale of each 32 values.
    d: HugeBuf<u16>,
}

/// A zeroed q8_0 store for `shape` (head sizes multiple of 32, else a clear error).
pub(super) fn q8_store(shape: KvShape) -> Result<KvStore, ModelError> {
    shape.check_cache_type()?;
    let per_layer = shape.n_ctx * shape.n_head_kv * shape.head_dim;
    let layers = || -> Result<Vec<Q8Layer>, ModelError> {
        (0..shape.n_layer)
            .map(|_| {
                Ok(Q8Layer {
                    qs: super::kv_buf(per_layer)?,
                    d: super::kv_buf(per_layer / 32)?,
                })
            })
            .collect()
    };
    Ok(KvStore::Q8 {
        k: layers()?,
        v: layers()?,
    })
}

/// RoPE angle tables kept between the layers of a forward pass (Gemma 3 alternates two bases).
const ROPE_TABLES: usize = 2;

/// The `(sin, cos)` of every rotary pair of a pass's positions for one set of frequencies.
#[derive(Debug)]
pub(super) struct RopeTable {
    inv_freq: Vec<f32>,
    pos: Vec<usize>,
    /// `[pos.len(), inv_freq.len()]` from [`k::rope_angles`].
    sc: Arc<Vec<(f32, f32)>>,
}

impl CpuBackend {
    /// The angle table of `pos` for `inv_freq`, from the cache when an earlier layer of the
    /// pass computed it (the same values [`k::rope_angles`] gives), else computed over the pool.
    fn rope_angles(&self, pos: &[usize], inv_freq: &[f32]) -> Arc<Vec<(f32, f32)>> {
        let mut tables = self.rope_tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables
            .iter()
            .find(|t| t.inv_freq == inv_freq && t.pos == pos)
        {
            return Arc::clone(&t.sc);
        }
        let half = inv_freq.len();
        let mut sc = vec![(0f32, 0f32); pos.len() * half]; // [n_tokens, half]
        if half > 0 {
            const ROWS: usize = 16;
            self.pool
                .for_each_chunk_mut(&mut sc, ROWS * half, &|c, chunk| {
                    for (i, row) in chunk.chunks_exact_mut(half).enumerate() {
                        k::rope_angles(pos[c * ROWS + i], inv_freq, row);
                    }
                });
        }
        let sc = Arc::new(sc);
        if tables.len() == ROPE_TABLES {
            tables.remove(0);
        }
        tables.push(RopeTable {
            inv_freq: inv_freq.to_vec(),
            pos: pos.to_vec(),
            sc: Arc::clone(&sc),
        });
        sc
    }

    /// See [`crate::backend::Backend::attention_batch`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn paged_attention(
        &self,
        cache: &mut CpuKvCache,
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
        let KvShape {
            n_ctx: n_slots,
            n_head_kv,
            head_dim: hd,
            ..
        } = cache.shape;
        let bs = batch.block_size;
        let q_width = shape.n_head * hd;
        let kv_width = n_head_kv * hd;
        let n_tokens = q.n_tokens;
        check_len("attention", "q row", q.width, q_width)?;
        check_len("attention", "k", kk.data.len(), n_tokens * kv_width)?;
        check_len("attention", "v", v.data.len(), n_tokens * kv_width)?;
        check_len("attention", "out", out.data.len(), q.data.len())?;
        if shape.n_head_kv != n_head_kv
            || shape.head_dim != hd
            || bs == 0
            || 2 * rope.inv_freq.len() > hd
        {
            return Err(ModelError::Tensor {
                what: format!("attention: shape {shape:?} does not match the cache"),
            });
        }
        let n_blocks = n_slots / bs;
        let mut covered = 0;
        for s in batch.seqs {
            let end = s.pos0 + s.rows.len();
            if s.rows.start != covered
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
        }
        if covered != n_tokens {
            return Err(ModelError::Tensor {
                what: format!("attention: sequences cover {covered} of {n_tokens} rows"),
            });
        }
        // Rotate every sequence's rows at its own positions: one (sin, cos) table per token
        // shared by its Q and K heads, tokens in chunks over the pool.
        let pos: Vec<usize> = batch // [n_tokens] position of each row
            .seqs
            .iter()
            .flat_map(|s| s.pos0..s.pos0 + s.rows.len())
            .collect();
        let angles = self.rope_angles(&pos, &rope.inv_freq); // [n_tokens, n_rot / 2]
        let half = rope.inv_freq.len();
        const ROPE_ROWS: usize = 16;
        let tasks: Vec<_> = q
            .data
            .chunks_mut(ROPE_ROWS * q_width)
            .zip(kk.data.chunks_mut(ROPE_ROWS * kv_width))
            .zip(angles.chunks(ROPE_ROWS * half.max(1)))
            .collect();
        self.pool.for_each_task(tasks, &|_, ((qc, kc), sc)| {
            for ((qr, kr), sc) in qc
                .chunks_exact_mut(q_width)
                .zip(kc.chunks_exact_mut(kv_width))
                .zip(sc.chunks_exact(half.max(1)))
            {
                k::rope_rotate(qr, hd, &sc[..half], rope.layout);
                k::rope_rotate(kr, hd, &sc[..half], rope.layout);
            }
        });
        let slot = |table: &[u32], p: usize| table[p / bs] as usize * bs + p % bs;
        let no_layer = || ModelError::Tensor {
            what: format!("attention: no cache for layer {layer}"),
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let queries: Vec<PagedQuery<'_>> = batch
            .seqs
            .iter()
            .flat_map(|s| {
                (0..s.rows.len()).map(move |t| PagedQuery {
                    table: s.table,
                    lo: attn.first_visible(s.pos0 + t),
                    hi: s.pos0 + t + 1,
                    scale,
                })
            })
            .collect();
        let pshape = PagedShape {
            n_head: shape.n_head,
            n_head_kv,
            head_dim: hd,
            n_slots,
            block_size: bs,
        };
        // Decode rows (one per sequence) a GQA group at a time; prompt chunks in tiles of
        // consecutive tokens sharing each K/V row. Both give the per-token kernel's results bit
        // for bit (f16 and q8_0 alike), so the route never changes a logit.
        let decode_only = batch.seqs.iter().all(|s| s.rows.len() == 1);
        // Each new row's slot: (activation row, head-major element offset of KV head 0).
        let writes = || {
            batch.seqs.iter().flat_map(move |s| {
                s.rows
                    .clone()
                    .enumerate()
                    .map(move |(t, row)| (row, slot(s.table, s.pos0 + t)))
            })
        };
        match &mut cache.store {
            KvStore::F16 { k: ks, v: vs } => {
                let (kc, vc) = match (ks.get_mut(layer), vs.get_mut(layer)) {
                    (Some(kc), Some(vc)) => (kc, vc),
                    _ => return Err(no_layer()),
                };
                for (row, sl) in writes() {
                    for h in 0..n_head_kv {
                        let src = row * kv_width + h * hd..row * kv_width + (h + 1) * hd;
                        let dst = (h * n_slots + sl) * hd;
                        damascus_kernels::elementwise::f32_to_f16_slice(
                            &kk.data[src.clone()],
                            &mut kc[dst..dst + hd],
                        );
                        damascus_kernels::elementwise::f32_to_f16_slice(
                            &v.data[src],
                            &mut vc[dst..dst + hd],
                        );
                    }
                }
                let attend = if decode_only {
                    attn_paged_f16_grouped
                } else {
                    attn_paged_f16
                };
                attend(
                    &queries,
                    &q.data,
                    kc,
                    vc,
                    pshape,
                    &mut out.data,
                    Some(&self.pool),
                )
                .map_err(|e| kernel_err("attention", e))
            }
            KvStore::Q8 { k: ks, v: vs } => {
                let (kc, vc) = match (ks.get_mut(layer), vs.get_mut(layer)) {
                    (Some(kc), Some(vc)) => (kc, vc),
                    _ => return Err(no_layer()),
                };
                // Quantized on write, one head row (whole 32-value blocks) at a time.
                let put = |c: &mut Q8Layer, src: &[f32], dst: usize| {
                    quantize_q8_0(
                        src,
                        &mut c.qs[dst..dst + hd],
                        &mut c.d[dst / 32..(dst + hd) / 32],
                    )
                    .map_err(|e| kernel_err("attention", e))
                };
                for (row, sl) in writes() {
                    for h in 0..n_head_kv {
                        let src = row * kv_width + h * hd..row * kv_width + (h + 1) * hd;
                        let dst = (h * n_slots + sl) * hd;
                        put(kc, &kk.data[src.clone()], dst)?;
                        put(vc, &v.data[src], dst)?;
                    }
                }
                let kr = Q8Rows::new(&kc.qs, &kc.d).map_err(|e| kernel_err("attention", e))?;
                let vr = Q8Rows::new(&vc.qs, &vc.d).map_err(|e| kernel_err("attention", e))?;
                let attend = if decode_only {
                    attn_paged_q8_grouped
                } else {
                    attn_paged_q8
                };
                attend(
                    &queries,
                    &q.data,
                    kr,
                    vr,
                    pshape,
                    &mut out.data,
                    Some(&self.pool),
                )
                .map_err(|e| kernel_err("attention", e))
            }
            KvStore::F32 { k: ks, v: vs } => {
                let (kc, vc) = match (ks.get_mut(layer), vs.get_mut(layer)) {
                    (Some(kc), Some(vc)) => (kc, vc),
                    _ => return Err(no_layer()),
                };
                let group = shape.n_head / n_head_kv;
                let mut scores = Vec::new();
                for s in batch.seqs {
                    for (t, row) in s.rows.clone().enumerate() {
                        let sl = slot(s.table, s.pos0 + t);
                        for h in 0..n_head_kv {
                            let src = row * kv_width + h * hd..row * kv_width + (h + 1) * hd;
                            let dst = (h * n_slots + sl) * hd;
                            kc[dst..dst + hd].copy_from_slice(&kk.data[src.clone()]);
                            vc[dst..dst + hd].copy_from_slice(&v.data[src]);
                        }
                    }
                    for (t, row) in s.rows.clone().enumerate() {
                        let n_vis = s.pos0 + t + 1;
                        let lo = attn.first_visible(s.pos0 + t);
                        for h in 0..shape.n_head {
                            let base = (h / group) * n_slots * hd;
                            let qh = &q.data[row * q_width + h * hd..][..hd];
                            scores.clear();
                            scores.extend((lo..n_vis).map(|p| {
                                let o = base + slot(s.table, p) * hd;
                                dot_f32(qh, &kc[o..o + hd]) * scale
                            }));
                            k::softmax(&mut scores);
                            let oh = &mut out.data[row * q_width + h * hd..][..hd];
                            oh.fill(0.0);
                            for (p, &w) in (lo..).zip(scores.iter()) {
                                let o = base + slot(s.table, p) * hd;
                                for (x, &y) in oh.iter_mut().zip(&vc[o..o + hd]) {
                                    *x += w * y;
                                }
                            }
                        }
                    }
                }
                Ok(())
            }
        }
    }
}
