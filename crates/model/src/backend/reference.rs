//! The scalar f32 reference backend: host activations, weights read straight from the mapping
//! and dequantized one row at a time, an f32 KV cache (by default; an f16 cache is emulated by
//! rounding keys and values through f16 as they are stored). The oracle for every other backend.

use damascus_kernels::quantdot::{f16_to_f32, f32_to_f16};
use damascus_kernels::reference as k;

use super::{AttnSpec, Backend, KvCacheType, KvShape, PagedBatch, RopeParams};

mod paged;
use crate::error::ModelError;
use crate::tensor::FileTensor;

/// The reference backend (stateless).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReferenceBackend;

/// A host activation buffer.
#[derive(Clone, Debug)]
pub struct HostAct {
    /// Rows.
    pub n_tokens: usize,
    /// Elements per row.
    pub width: usize,
    /// `[n_tokens, width]` f32.
    pub data: Vec<f32>,
}

/// The KV cache of every layer, held in f32 (values f16-rounded when `shape.cache_type` is
/// [`KvCacheType::F16`], quantized to q8_0 and back when it is [`KvCacheType::Q8_0`]: what
/// the fast backend's cache gives back, exactly).
#[derive(Debug)]
pub struct HostKvCache {
    shape: KvShape,
    /// Per layer: `[n_ctx, n_head_kv, head_dim]` f32 keys.
    k: Vec<Vec<f32>>,
    /// Per layer: `[n_ctx, n_head_kv, head_dim]` f32 values.
    v: Vec<Vec<f32>>,
}

/// Rounds freshly written cache rows `xs` (whole rows of `n_head_kv · head_dim`) to what a
/// cache of `ty` holds: f16, or q8_0 (per 32 values: quantize, dequantize), or f32 unchanged.
pub(super) fn store_rounding(ty: KvCacheType, xs: &mut [f32]) -> Result<(), ModelError> {
    match ty {
        KvCacheType::F32 => {}
        KvCacheType::F16 => xs.iter_mut().for_each(|x| *x = f16_to_f32(f32_to_f16(*x))),
        KvCacheType::Q8_0 => {
            damascus_kernels::attn_kv::round_trip_q8_0(xs).map_err(|e| ModelError::CacheType {
                cache_type: ty.name().into(),
                why: e.to_string(),
            })?
        }
    }
    Ok(())
}

/// Checks that a buffer has the expected number of elements (shared by the host backends).
pub(super) fn check_len(
    op: &str,
    what: &str,
    found: usize,
    expected: usize,
) -> Result<(), ModelError> {
    if found == expected {
        Ok(())
    } else {
        Err(ModelError::Tensor {
            what: format!("{op}: {what} has {found} elements, expected {expected}"),
        })
    }
}

/// The element-wise and copy ops on host activations, shared by every backend whose
/// activations are [`HostAct`] (the reference and the CPU backend).
pub(super) mod host_ops {
    use super::{HostAct, RopeParams, check_len, k};
    use crate::error::ModelError;

    /// `out = rms_norm(x) * w` — x, out [n_tokens, width] f32; w [width] f32.
    pub fn rms_norm(x: &HostAct, w: &[f32], eps: f32, out: &mut HostAct) -> Result<(), ModelError> {
        check_len("rms_norm", "x row", x.width, w.len())?;
        check_len("rms_norm", "out", out.data.len(), x.data.len())?;
        k::rms_norm(&x.data, w, eps, &mut out.data);
        Ok(())
    }

    /// `x` as `[n_tokens, width]` in place (the vector keeps its capacity; new rows zero).
    pub fn set_rows(x: &mut HostAct, n_tokens: usize) -> Result<bool, ModelError> {
        let len = n_tokens
            .checked_mul(x.width)
            .ok_or_else(|| ModelError::Tensor {
                what: format!("set_rows: {n_tokens} rows of {}", x.width),
            })?;
        x.data.resize(len, 0.0);
        x.n_tokens = n_tokens;
        Ok(true)
    }

    /// Rotary embedding in place — x [n_tokens, n_head * head_dim] f32, positions pos0.. .
    pub fn rope(
        x: &mut HostAct,
        n_head: usize,
        pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        check_len("rope", "x row", x.width, n_head * rope.head_dim)?;
        k::rope(
            &mut x.data,
            n_head,
            rope.head_dim,
            pos0,
            &rope.inv_freq,
            rope.layout,
        );
        Ok(())
    }

    /// `gate = silu(gate) * up` — [n_tokens, n_ff] f32 each.
    pub fn swiglu(gate: &mut HostAct, up: &HostAct) -> Result<(), ModelError> {
        check_len("swiglu", "up", up.data.len(), gate.data.len())?;
        k::swiglu(&mut gate.data, &up.data);
        Ok(())
    }

    /// `x += y` — [n_tokens, width] f32 each.
    pub fn add(x: &mut HostAct, y: &HostAct) -> Result<(), ModelError> {
        check_len("add", "y", y.data.len(), x.data.len())?;
        k::add(&mut x.data, &y.data);
        Ok(())
    }

    /// `dst = src[row]` — src [n_tokens, width], dst [1, width].
    pub fn copy_row(src: &HostAct, row: usize, dst: &mut HostAct) -> Result<(), ModelError> {
        check_len("copy_row", "dst", dst.data.len(), src.width)?;
        if row >= src.n_tokens {
            return Err(ModelError::Tensor {
                what: format!("copy_row: row {row} of {}", src.n_tokens),
            });
        }
        dst.data
            .copy_from_slice(&src.data[row * src.width..(row + 1) * src.width]);
        Ok(())
    }

    /// `dst[i] = src[rows[i]]` — src [n_tokens, width], dst [rows.len(), width].
    pub fn copy_rows(src: &HostAct, rows: &[usize], dst: &mut HostAct) -> Result<(), ModelError> {
        check_len("copy_rows", "dst", dst.data.len(), rows.len() * src.width)?;
        for (i, &row) in rows.iter().enumerate() {
            if row >= src.n_tokens {
                return Err(ModelError::Tensor {
                    what: format!("copy_rows: row {row} of {}", src.n_tokens),
                });
            }
            dst.data[i * src.width..(i + 1) * src.width]
                .copy_from_slice(&src.data[row * src.width..(row + 1) * src.width]);
        }
        Ok(())
    }

    /// `x = data` (same length).
    pub fn write(x: &mut HostAct, data: &[f32]) -> Result<(), ModelError> {
        check_len("write", "data", data.len(), x.data.len())?;
        x.data.copy_from_slice(data);
        Ok(())
    }

    /// `x[t] += b` — x [n_tokens, width], b [width].
    pub fn add_bias(x: &mut HostAct, b: &[f32]) -> Result<(), ModelError> {
        check_len("add_bias", "bias", b.len(), x.width)?;
        k::add_bias(&mut x.data, b);
        Ok(())
    }

    /// Per-head RMSNorm in place — x [n_tokens, n_heads * head_dim], w [head_dim].
    pub fn rms_norm_heads(
        x: &mut HostAct,
        w: &[f32],
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        check_len("rms_norm_heads", "weight", w.len(), head_dim)?;
        if head_dim == 0 || !x.width.is_multiple_of(head_dim) {
            return Err(ModelError::Tensor {
                what: format!(
                    "rms_norm_heads: row of {} is not whole heads of {head_dim}",
                    x.width
                ),
            });
        }
        let input = x.data.clone();
        k::rms_norm(&input, w, eps, &mut x.data);
        Ok(())
    }

    /// `x *= s`.
    pub fn scale(x: &mut HostAct, s: f32) {
        x.data.iter_mut().for_each(|v| *v *= s);
    }

    /// `x = cap · tanh(x / cap)`.
    pub fn softcap(x: &mut HostAct, cap: f32) {
        k::softcap(&mut x.data, cap);
    }
}

impl Backend for ReferenceBackend {
    type Act = HostAct;
    type Matrix = FileTensor;
    type Vector = Vec<f32>;
    type KvCache = HostKvCache;

    fn name(&self) -> &'static str {
        "reference"
    }

    fn prepare_matrix(&self, w: &FileTensor) -> Result<FileTensor, ModelError> {
        // Validate once; later views of the same bytes cannot fail on shape.
        w.view()?.as_weight()?;
        Ok(w.clone())
    }

    fn prepare_vector(&self, w: &FileTensor) -> Result<Vec<f32>, ModelError> {
        w.view()?.to_f32_vec()
    }

    fn alloc(&self, n_tokens: usize, width: usize) -> Result<HostAct, ModelError> {
        Ok(HostAct {
            n_tokens,
            width,
            data: vec![0.0; n_tokens * width],
        })
    }

    fn set_rows(&self, x: &mut HostAct, n_tokens: usize) -> Result<bool, ModelError> {
        host_ops::set_rows(x, n_tokens)
    }

    fn default_cache_type(&self) -> KvCacheType {
        KvCacheType::F32
    }

    fn new_kv_cache(&self, shape: KvShape) -> Result<HostKvCache, ModelError> {
        shape.check_cache_type()?;
        shape.check_host_memory()?;
        let per_layer = shape.n_ctx * shape.n_head_kv * shape.head_dim;
        // Zeroed allocations are lazily backed by the OS: only used positions cost memory.
        Ok(HostKvCache {
            shape,
            k: (0..shape.n_layer).map(|_| vec![0.0; per_layer]).collect(),
            v: (0..shape.n_layer).map(|_| vec![0.0; per_layer]).collect(),
        })
    }

    fn embed(&self, table: &FileTensor, ids: &[u32], out: &mut HostAct) -> Result<(), ModelError> {
        let view = table.view()?;
        let w = view.as_weight()?;
        check_len("embed", "out", out.data.len(), ids.len() * w.cols)?;
        k::embed_rows(&w, ids, &mut out.data)?;
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &HostAct,
        w: &Vec<f32>,
        eps: f32,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        host_ops::rms_norm(x, w, eps, out)
    }

    fn matmul(&self, w: &FileTensor, x: &HostAct, out: &mut HostAct) -> Result<(), ModelError> {
        let view = w.view()?;
        let wv = view.as_weight()?;
        check_len("matmul", "x row", x.width, wv.cols)?;
        check_len("matmul", "out", out.data.len(), x.n_tokens * wv.rows)?;
        k::matmul(&wv, &x.data, &mut out.data)?;
        Ok(())
    }

    fn rope(
        &self,
        x: &mut HostAct,
        n_head: usize,
        pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        host_ops::rope(x, n_head, pos0, rope)
    }

    fn attention(
        &self,
        cache: &mut HostKvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        q: &HostAct,
        kk: &HostAct,
        v: &HostAct,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        let n_tokens = q.n_tokens;
        let shape = attn.shape;
        let kv_width = cache.shape.n_head_kv * cache.shape.head_dim;
        if pos0 + n_tokens > cache.shape.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: cache.shape.n_ctx,
                n_past: pos0,
                n_tokens,
            });
        }
        check_len("attention", "k", kk.data.len(), n_tokens * kv_width)?;
        check_len("attention", "v", v.data.len(), n_tokens * kv_width)?;
        check_len("attention", "q row", q.width, shape.n_head * shape.head_dim)?;
        let (kc, vc) = match (cache.k.get_mut(layer), cache.v.get_mut(layer)) {
            (Some(kc), Some(vc)) => (kc, vc),
            _ => {
                return Err(ModelError::Tensor {
                    what: format!("attention: no cache for layer {layer}"),
                });
            }
        };
        let span = pos0 * kv_width..(pos0 + n_tokens) * kv_width;
        kc[span.clone()].copy_from_slice(&kk.data);
        vc[span.clone()].copy_from_slice(&v.data);
        store_rounding(cache.shape.cache_type, &mut kc[span.clone()])?;
        store_rounding(cache.shape.cache_type, &mut vc[span])?;
        let valid = (pos0 + n_tokens) * kv_width;
        k::attention_window(
            &q.data,
            &kc[..valid],
            &vc[..valid],
            shape,
            pos0,
            attn.window,
            &mut out.data,
        );
        Ok(())
    }

    fn swiglu(&self, gate: &mut HostAct, up: &HostAct) -> Result<(), ModelError> {
        host_ops::swiglu(gate, up)
    }

    fn geglu(&self, gate: &mut HostAct, up: &HostAct) -> Result<(), ModelError> {
        check_len("geglu", "up", up.data.len(), gate.data.len())?;
        k::geglu(&mut gate.data, &up.data);
        Ok(())
    }

    fn add_bias(&self, x: &mut HostAct, b: &Vec<f32>) -> Result<(), ModelError> {
        host_ops::add_bias(x, b)
    }

    fn rms_norm_heads(
        &self,
        x: &mut HostAct,
        w: &Vec<f32>,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        host_ops::rms_norm_heads(x, w, eps, head_dim)
    }

    fn scale(&self, x: &mut HostAct, s: f32) -> Result<(), ModelError> {
        host_ops::scale(x, s);
        Ok(())
    }

    fn softcap(&self, x: &mut HostAct, cap: f32) -> Result<(), ModelError> {
        host_ops::softcap(x, cap);
        Ok(())
    }

    fn add(&self, x: &mut HostAct, y: &HostAct) -> Result<(), ModelError> {
        host_ops::add(x, y)
    }

    fn copy_row(&self, src: &HostAct, row: usize, dst: &mut HostAct) -> Result<(), ModelError> {
        host_ops::copy_row(src, row, dst)
    }

    fn copy_rows(
        &self,
        src: &HostAct,
        rows: &[usize],
        dst: &mut HostAct,
    ) -> Result<(), ModelError> {
        host_ops::copy_rows(src, rows, dst)
    }

    fn supports_batches(&self) -> bool {
        true
    }

    fn attention_batch(
        &self,
        cache: &mut HostKvCache,
        layer: usize,
        attn: AttnSpec,
        rope: &RopeParams,
        batch: &PagedBatch<'_>,
        q: &mut HostAct,
        k: &mut HostAct,
        v: &HostAct,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        paged::attention_batch(cache, layer, attn, rope, batch, q, k, v, out)
    }

    fn read(&self, x: &HostAct) -> Result<Vec<f32>, ModelError> {
        Ok(x.data.clone())
    }

    fn write(&self, x: &mut HostAct, data: &[f32]) -> Result<(), ModelError> {
        host_ops::write(x, data)
    }
}
