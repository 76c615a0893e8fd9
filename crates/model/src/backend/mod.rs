//! The backend seam: the ops the decoder needs, at a granularity that a scalar reference, a
//! multithreaded SIMD CPU backend and a CUDA backend (device-resident activations, graph
//! capture) can all implement.
//!
//! The decoder ([`crate::decoder`]) owns no arithmetic: it allocates activations through the
//! backend, asks it to prepare every weight once at load ([`Backend::prepare_matrix`] may
//! repack, quantize or upload), and then drives one forward pass as a fixed sequence of ops.
//! Activations, prepared weights and the KV cache are associated types, so a GPU backend keeps
//! them on the device and the decoder never sees a pointer. Host data crosses the seam only in
//! [`Backend::embed`] (token ids), [`Backend::read`] (logits, and hidden states for `verify`)
//! and [`Backend::write`] (activations moving between the two sides of a [`split::Split`]).
//!
//! Fused ops ([`Backend::qkv`], [`Backend::ffn_gate_up`], [`Backend::matmul_add`],
//! [`Backend::rope_attention`]) have default implementations in terms of the primitive ones;
//! fast backends override them.
//!
//! Every backend is checked against [`reference::ReferenceBackend`], the scalar f32 oracle.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod profile;
pub mod reference;
pub mod split;

use damascus_kernels::reference::{AttnShape, RopeLayout};

use crate::error::ModelError;
use crate::family::Activation;
use crate::tensor::FileTensor;

/// One layer's attention: the head geometry and, for a sliding-window layer, how many
/// positions each query sees (itself included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnSpec {
    /// Query/KV heads and head size.
    pub shape: AttnShape,
    /// `Some(w)`: token at position `p` attends to positions `p + 1 - w ..= p` only.
    pub window: Option<usize>,
}

impl AttnSpec {
    /// Full causal attention (no window).
    pub fn causal(shape: AttnShape) -> AttnSpec {
        AttnSpec {
            shape,
            window: None,
        }
    }

    /// The first position a query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Whether the window hides any position from a query at `pos` or earlier.
    pub fn clips(&self, pos: usize) -> bool {
        self.first_visible(pos) > 0
    }
}

/// The error of an op a backend does not implement (yet).
pub fn unsupported(backend: &str, op: &str) -> ModelError {
    ModelError::Tensor {
        what: format!("{op} is not implemented on the {backend} backend"),
    }
}

/// Geometry of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Layers.
    pub n_layer: usize,
    /// Positions held (the context length).
    pub n_ctx: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Element type of the stored keys and values.
    pub cache_type: KvCacheType,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvCacheType {
    /// 16-bit floats (half the memory; the fast path's default).
    #[default]
    F16,
    /// 32-bit floats (the reference backend's default).
    F32,
    /// llama.cpp's q8_0: per 32 values of a head's row one f16 scale `d = amax / 127` and 32
    /// i8 `round(x / d)` (34 bytes per 32 values, ≈ 1.88× the positions of f16 in the same
    /// memory). The CPU and CUDA backends store it; the reference backend emulates it
    /// (quantizes, then dequantizes on write); head sizes must be multiples of 32.
    Q8_0,
}

impl KvCacheType {
    /// The name users spell (`--cache-type`): `f16`, `f32`, `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F16 => "f16",
            KvCacheType::F32 => "f32",
            KvCacheType::Q8_0 => "q8_0",
        }
    }

    /// Bytes of one key (or value) row of `head_dim` elements.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvCacheType::F16 => 2 * head_dim,
            KvCacheType::F32 => 4 * head_dim,
            KvCacheType::Q8_0 => head_dim + 2 * head_dim.div_ceil(32),
        }
    }
}

impl std::fmt::Display for KvCacheType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvCacheType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvCacheType::F16),
            "f32" => Ok(KvCacheType::F32),
            "q8_0" => Ok(KvCacheType::Q8_0),
            _ => Err(format!(
                "unknown KV cache type '{s}' (expected f16, q8_0 or f32)"
            )),
        }
    }
}

impl KvShape {
    /// Bytes of one position (slot) of every layer: keys and values of every KV head.
    pub fn bytes_per_slot(&self) -> usize {
        2 * self.n_layer * self.n_head_kv * self.cache_type.row_bytes(self.head_dim)
    }

    /// Bytes of the whole cache (`n_ctx` slots).
    pub fn bytes(&self) -> usize {
        self.n_ctx.saturating_mul(self.bytes_per_slot())
    }

    /// A clear error when a cache of this shape in host memory could never be backed: more
    /// bytes than the machine's memory and swap (the allocator would abort the process).
    /// Below that the zeroed allocations stay lazy, so only the positions used cost memory.
    pub fn check_host_memory(&self) -> Result<(), ModelError> {
        let Some(have) = damascus_kernels::cpu::host_memory_bytes() else {
            return Ok(());
        };
        let need = self.bytes() as u64;
        if need > have {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(ModelError::KvTooLarge {
                positions: self.n_ctx,
                cache_type: self.cache_type.name().into(),
                need_gib: gib(need),
                have_gib: gib(have),
            });
        }
        Ok(())
    }

    /// A clear error when the element type cannot hold this geometry (q8_0 needs whole
    /// 32-value blocks per head row).
    pub fn check_cache_type(&self) -> Result<(), ModelError> {
        if self.cache_type == KvCacheType::Q8_0 && !self.head_dim.is_multiple_of(32) {
            return Err(ModelError::CacheType {
                cache_type: self.cache_type.name().into(),
                why: format!(
                    "needs a head size that is a multiple of 32; this model's is {} (use --cache-type f16)",
                    self.head_dim
                ),
            });
        }
        Ok(())
    }
}

/// Rotary embedding parameters, fixed at load.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    /// Pair layout (adjacent for GGUF llama).
    pub layout: RopeLayout,
    /// Elements per head.
    pub head_dim: usize,
    /// `[n_rot / 2]` inverse frequencies, llama3 factors already applied.
    pub inv_freq: Vec<f32>,
}

/// One sequence's rows in a batched pass over a paged KV cache.
#[derive(Clone, Debug)]
pub struct SeqSpan<'a> {
    /// Rows of the activations that belong to it (consecutive, in sequence order).
    pub rows: std::ops::Range<usize>,
    /// Position of its first row (positions `0..pos0` are already in the cache).
    pub pos0: usize,
    /// Its block table: position `p` lives in slot `table[p / block_size] * block_size + p %
    /// block_size` of the cache; covers `pos0 + rows.len()` positions.
    pub table: &'a [u32],
}

/// The sequences of one batched pass, over a KV cache of `n_ctx` slots cut into blocks.
#[derive(Clone, Copy, Debug)]
pub struct PagedBatch<'a> {
    /// Slots per block.
    pub block_size: usize,
    /// The sequences, their rows consecutive and covering every row.
    pub seqs: &'a [SeqSpan<'a>],
}

impl PagedBatch<'_> {
    /// The one sequence of a batch whose blocks are the cache's first ones in order (a
    /// private cache), if that is what this batch is.
    pub fn single_contiguous(&self) -> Option<&SeqSpan<'_>> {
        match self.seqs {
            [s] if s.rows.start == 0
                && s.table.iter().enumerate().all(|(i, &b)| b as usize == i) =>
            {
                Some(s)
            }
            _ => None,
        }
    }
}

/// The ops of a Llama forward pass. All activations are `[n_tokens, width]` f32 in meaning;
/// their physical layout and location are the backend's business.
pub trait Backend: Send + Sync + Sized + 'static {
    /// An activation buffer of `[n_tokens, width]` f32.
    type Act: Send;
    /// A prepared weight matrix `[rows, cols]` (`y = x · Wᵀ`).
    type Matrix: Send + Sync;
    /// A prepared f32 vector (norm weights).
    type Vector: Send + Sync;
    /// The KV cache of every layer.
    type KvCache: Send;

    /// Short name for logs and `--device-info` (`"reference"`, `"cpu-avx512"`, `"cuda"`).
    fn name(&self) -> &'static str;

    /// What preparing the weights did beyond mapping them, for the user (e.g. `"repacked 197
    /// tensors, 1.93 GiB, in 1.2 s"`); `None` when nothing worth reporting. Read after load.
    fn load_note(&self) -> Option<String> {
        None
    }

    /// Prepares a 2-D weight for [`Backend::matmul`] / [`Backend::embed`]: keep the mapping,
    /// repack or upload it. Called once per tensor at load.
    fn prepare_matrix(&self, w: &FileTensor) -> Result<Self::Matrix, ModelError>;

    /// Prepares a 1-D f32 weight (a norm scale). Called once per tensor at load.
    fn prepare_vector(&self, w: &FileTensor) -> Result<Self::Vector, ModelError>;

    /// Allocates an activation buffer `[n_tokens, width]` (contents unspecified).
    fn alloc(&self, n_tokens: usize, width: usize) -> Result<Self::Act, ModelError>;

    /// Makes `x` (from [`Backend::alloc`], `width` unchanged) an activation of `n_tokens` rows
    /// in place, reusing its storage (contents unspecified), so a caller can keep one set of
    /// buffers for passes of varying size: no allocation per pass, and device addresses that
    /// stay put (a captured graph replays). `Ok(false)` when `x` cannot hold `n_tokens` rows
    /// (the caller allocates anew). Default: `Ok(false)`.
    fn set_rows(&self, x: &mut Self::Act, n_tokens: usize) -> Result<bool, ModelError> {
        let _ = (x, n_tokens);
        Ok(false)
    }

    /// Allocates a KV cache for `shape.n_ctx` positions of every layer.
    fn new_kv_cache(&self, shape: KvShape) -> Result<Self::KvCache, ModelError>;

    /// The KV cache element type used when the caller asks for none.
    fn default_cache_type(&self) -> KvCacheType {
        KvCacheType::F16
    }

    /// Called before the ops of one forward pass (a CUDA backend may start graph capture or
    /// replay here). Default: nothing.
    fn begin_forward(&self, n_tokens: usize, pos0: usize) -> Result<(), ModelError> {
        let _ = (n_tokens, pos0);
        Ok(())
    }

    /// Called after the last op of one forward pass. Default: nothing.
    fn end_forward(&self) -> Result<(), ModelError> {
        Ok(())
    }

    /// `out[t] = table[ids[t]]`: `table` `[n_vocab, n_embd]`, `out` `[n_tokens, n_embd]`.
    fn embed(
        &self,
        table: &Self::Matrix,
        ids: &[u32],
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `out = rms_norm(x) * w`: `x`, `out` `[n_tokens, n]`, `w` `[n]`.
    fn rms_norm(
        &self,
        x: &Self::Act,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `out = x · Wᵀ`: `w` `[rows, cols]`, `x` `[n_tokens, cols]`, `out` `[n_tokens, rows]`.
    fn matmul(
        &self,
        w: &Self::Matrix,
        x: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// Rotates `x` `[n_tokens, n_head, head_dim]` in place; token `t` sits at `pos0 + t`.
    fn rope(
        &self,
        x: &mut Self::Act,
        n_head: usize,
        pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError>;

    /// Writes `k`, `v` (`[n_tokens, n_head_kv, head_dim]`) into `layer`'s cache at positions
    /// `pos0..pos0 + n_tokens`, then computes causal GQA attention of `q`
    /// (`[n_tokens, n_head, head_dim]`) over positions `attn.first_visible(pos0 + t)..=pos0 + t`
    /// into `out`, scores scaled by `1/sqrt(head_dim)`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        q: &Self::Act,
        k: &Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `gate = silu(gate) * up`, both `[n_tokens, n_ff]`.
    fn swiglu(&self, gate: &mut Self::Act, up: &Self::Act) -> Result<(), ModelError>;

    /// `gate = gelu_tanh(gate) * up`, both `[n_tokens, n_ff]` (GeGLU).
    fn geglu(&self, gate: &mut Self::Act, up: &Self::Act) -> Result<(), ModelError> {
        let _ = (gate, up);
        Err(unsupported(self.name(), "geglu"))
    }

    /// `x[t] += b` for every row: `x` `[n_tokens, n]`, `b` `[n]` (a projection's bias).
    fn add_bias(&self, x: &mut Self::Act, b: &Self::Vector) -> Result<(), ModelError> {
        let _ = (x, b);
        Err(unsupported(self.name(), "add_bias"))
    }

    /// RMSNorm of every head in place: `x` `[n_tokens, n_heads, head_dim]`, `w` `[head_dim]`
    /// (Qwen 3 / Gemma 3 Q/K norms).
    fn rms_norm_heads(
        &self,
        x: &mut Self::Act,
        w: &Self::Vector,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        let _ = (x, w, eps, head_dim);
        Err(unsupported(self.name(), "rms_norm_heads"))
    }

    /// `x *= s` element-wise.
    fn scale(&self, x: &mut Self::Act, s: f32) -> Result<(), ModelError> {
        let _ = (x, s);
        Err(unsupported(self.name(), "scale"))
    }

    /// `x = cap · tanh(x / cap)` element-wise (final-logit soft-capping).
    fn softcap(&self, x: &mut Self::Act, cap: f32) -> Result<(), ModelError> {
        let _ = (x, cap);
        Err(unsupported(self.name(), "softcap"))
    }

    /// `x += y`, both `[n_tokens, n]`.
    fn add(&self, x: &mut Self::Act, y: &Self::Act) -> Result<(), ModelError>;

    /// Copies row `row` of `src` `[n_tokens, n]` into `dst` `[1, n]`.
    fn copy_row(&self, src: &Self::Act, row: usize, dst: &mut Self::Act) -> Result<(), ModelError>;

    /// Reads `x` back to the host as `[n_tokens, width]` f32, row-major.
    fn read(&self, x: &Self::Act) -> Result<Vec<f32>, ModelError>;

    /// The index of the largest value of every row of `x` `[n_tokens, width]` (greedy
    /// decoding): NaN never wins, ties go to the lowest index ([`host_argmax`]).
    /// Default: [`Backend::read`], then [`host_argmax`] per row; a device backend overrides
    /// it to copy back one id per row instead of the whole row.
    fn argmax(&self, x: &Self::Act, width: usize) -> Result<Vec<u32>, ModelError> {
        let data = self.read(x)?;
        if width == 0 || !data.len().is_multiple_of(width) {
            return Err(ModelError::Tensor {
                what: format!("argmax: {} values are not rows of {width}", data.len()),
            });
        }
        Ok(data.chunks_exact(width).map(host_argmax).collect())
    }

    /// Overwrites `x` with host `[n_tokens, width]` f32, row-major: the inverse of
    /// [`Backend::read`] (how [`split::Split`] moves activations between backends).
    fn write(&self, x: &mut Self::Act, data: &[f32]) -> Result<(), ModelError>;

    /// Whether [`Backend::attention_batch`] takes several sequences over a shared paged cache
    /// (the server then batches requests). Default: no.
    fn supports_batches(&self) -> bool {
        false
    }

    /// The attention of a batched pass: for every sequence of `batch`, RoPE on its rows of `q`
    /// and `k` at its own positions, its keys and values written into its slots of `cache`,
    /// then causal GQA attention of each of its rows over its own positions into `out`. A row's
    /// result must not depend on the other rows (batch invariance). Default: a batch of one
    /// sequence over a private cache ([`PagedBatch::single_contiguous`]), through
    /// [`Backend::rope_attention`]; backends that return true from
    /// [`Backend::supports_batches`] override it.
    #[allow(clippy::too_many_arguments)]
    fn attention_batch(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        attn: AttnSpec,
        rope: &RopeParams,
        batch: &PagedBatch<'_>,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        match batch.single_contiguous() {
            Some(s) => self.rope_attention(cache, layer, attn, s.pos0, rope, q, k, v, out),
            None => Err(ModelError::Tensor {
                what: format!(
                    "the {} backend runs one sequence at a time (no batched attention)",
                    self.name()
                ),
            }),
        }
    }

    /// Copies rows `rows` of `src` `[n_tokens, n]` into `dst` `[rows.len(), n]`. Default: one
    /// row through [`Backend::copy_row`].
    fn copy_rows(
        &self,
        src: &Self::Act,
        rows: &[usize],
        dst: &mut Self::Act,
    ) -> Result<(), ModelError> {
        match rows {
            [r] => self.copy_row(src, *r, dst),
            _ => Err(ModelError::Tensor {
                what: format!("the {} backend copies one row at a time", self.name()),
            }),
        }
    }

    /// Q, K and V projections of the same normed input `x` `[n_tokens, n_embd]`.
    /// Default: three [`Backend::matmul`]s.
    #[allow(clippy::too_many_arguments)]
    fn qkv(
        &self,
        x: &Self::Act,
        wq: &Self::Matrix,
        wk: &Self::Matrix,
        wv: &Self::Matrix,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &mut Self::Act,
    ) -> Result<(), ModelError> {
        self.matmul(wq, x, q)?;
        self.matmul(wk, x, k)?;
        self.matmul(wv, x, v)
    }

    /// `acc += x · Wᵀ`, an output projection with its residual add; `scratch`
    /// `[n_tokens, rows]` may be used for the product. Default: [`Backend::matmul`] into
    /// `scratch`, then [`Backend::add`].
    fn matmul_add(
        &self,
        w: &Self::Matrix,
        x: &Self::Act,
        acc: &mut Self::Act,
        scratch: &mut Self::Act,
    ) -> Result<(), ModelError> {
        self.matmul(w, x, scratch)?;
        self.add(acc, scratch)
    }

    /// RoPE on `q` and `k`, then [`Backend::attention`] (a backend may fuse the rotation into
    /// the cache write; `k` is then unspecified afterwards). Default: two [`Backend::rope`]s
    /// and [`Backend::attention`].
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        rope: &RopeParams,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError> {
        self.rope(q, attn.shape.n_head, pos0, rope)?;
        self.rope(k, attn.shape.n_head_kv, pos0, rope)?;
        self.attention(cache, layer, attn, pos0, q, k, v, out)
    }

    /// `gate = act(x · W_gateᵀ) * (x · W_upᵀ)`, the first half of the gated FFN; `up` is
    /// scratch. Default: two matmuls and [`Backend::swiglu`] or [`Backend::geglu`].
    #[allow(clippy::too_many_arguments)]
    fn ffn_gate_up(
        &self,
        x: &Self::Act,
        w_gate: &Self::Matrix,
        w_up: &Self::Matrix,
        act: Activation,
        gate: &mut Self::Act,
        up: &mut Self::Act,
    ) -> Result<(), ModelError> {
        self.matmul(w_gate, x, gate)?;
        self.matmul(w_up, x, up)?;
        match act {
            Activation::Silu => self.swiglu(gate, up),
            Activation::GeluTanh => self.geglu(gate, up),
        }
    }
}

/// The index of the largest value of `row`, the greedy pick: NaN counts as `-inf` (never
/// wins), `+inf` as `f32::MAX`, and ties go to the lowest index (like the sampler's greedy
/// stage and `torch.argmax`). 0 for an empty row.
pub fn host_argmax(row: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0usize);
    for (i, &v) in row.iter().enumerate() {
        let v = if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v.min(f32::MAX)
        };
        if v > best.0 {
            best = (v, i);
        }
    }
    best.1 as u32
}

#[cfg(test)]
mod tests {
    use super::host_argmax;

    #[test]
    fn host_argmax_skips_nan_and_breaks_ties_low() {
        assert_eq!(host_argmax(&[]), 0);
        assert_eq!(host_argmax(&[f32::NAN]), 0);
        assert_eq!(host_argmax(&[1.0, 3.0, 3.0, -2.0]), 1);
        assert_eq!(host_argmax(&[f32::NAN, 0.5, f32::NAN, 0.7]), 3);
        assert_eq!(
            host_argmax(&[0.0, f32::INFINITY, f32::MAX, f32::INFINITY]),
            1
        );
        assert_eq!(host_argmax(&[f32::NEG_INFINITY; 5]), 0);
    }
}
