//! The CUDA backend (feature `cuda`): the model resident on one GPU.
//!
//! Weights are uploaded once at load in their device layout ([`damascus_cuda::layout`]):
//! Q4_K, Q4_1, Q8_0, Q5_0 and Q6_K stay quantized (dp4a GEMVs against q8 activations for
//! decode); every other type is dequantized to f16 on the host. Prompts of
//! [`damascus_cuda::GEMM_MIN_TOKENS`] tokens or more multiply through cuBLAS in bf16, with a
//! bf16 copy of each weight made on the device the first time a prompt needs it (memory cost:
//! 2 bytes per weight of every matrix a prompt touches, i.e. not the LM head, which only ever
//! sees the last position).
//!
//! Activations and the KV cache (f16, or q8_0 with `--cache-type q8_0`: quantized per 32-value
//! block by the cache write as the CPU's `quantize_q8_0` does, widened in registers by every
//! attention kernel) never leave the device; ops are recorded and flushed at
//! the end of the pass, and a decode step (one token) replays a captured CUDA graph (see
//! `damascus_cuda::gpu`). Logits come back to the host in [`Backend::read`].
//!
//! One device recorder serves every sequence, so forward passes on one `CudaBackend` are
//! serialized: `begin_forward` waits until no other pass is between its own `begin_forward` and
//! `end_forward` (the decoder always calls both), so several server slots may share one GPU.
//!
//! Batched passes ([`Backend::attention_batch`]: the server's continuous batching) run over one
//! shared paged pool: the layer caches' slots are the pool's slots, each sequence's rows are
//! rotated at their own positions and written through its block table, decode rows take the
//! split-K decode kernel and prompt chunks the flash kernel, each over its own sequence's
//! blocks (`damascus_cuda::Gpu::attention_paged`). A lone sequence over a private cache keeps
//! the contiguous kernels and its decode graph.

use std::sync::{Arc, Condvar, Mutex};

use damascus_cuda::{AttnParams, DevAct, DevKv, DevMatrix, DevVec, Gpu, KvElem, PagedSeq};
use damascus_kernels::reference::{AttnShape, RopeLayout};
use damascus_kernels::settings::KernelSettings;

use crate::backend::profile::weight_class;
use crate::backend::{AttnSpec, Backend, KvCacheType, KvShape, PagedBatch, RopeParams};
use crate::error::ModelError;
use crate::family::Activation;
use crate::tensor::FileTensor;

/// The model on one CUDA device.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    /// Every quantized matrix takes two-level q8 activations (`KernelSettings::two_level_all`).
    two_level_all: bool,
    /// The rope inverse frequencies on the device, keyed by their host values.
    /// Every set of frequencies seen (Gemma 3 alternates two), kept for the backend's life:
    /// recorded launches name them, so one must not be freed (and its memory reused by the next
    /// upload) before the pass that reads it has run.
    inv_freq: Mutex<Vec<(Vec<f32>, Arc<DevVec>)>>,
    /// A forward pass is being recorded (between `begin_forward` and `end_forward`).
    busy: Mutex<bool>,
    idle: Condvar,
}

/// The KV cache: allocated on the first attention call, when the query head count is known.
pub struct CudaKvCache {
    shape: KvShape,
    kv: Option<DevKv>,
}

impl CudaBackend {
    /// Opens CUDA device `ordinal` (compiles or loads the kernels) with the default settings.
    pub fn new(ordinal: usize) -> Result<Self, ModelError> {
        Self::with_settings(ordinal, &KernelSettings::default())
    }

    /// Opens CUDA device `ordinal` with `settings` (those that apply on the GPU:
    /// `two_level_qkv` and the `cuda_*` ones).
    pub fn with_settings(ordinal: usize, settings: &KernelSettings) -> Result<Self, ModelError> {
        let gpu = Gpu::open_with(ordinal, settings.cuda_profile)?;
        gpu.set_two_level_qkv(settings.two_level_qkv);
        gpu.set_graphs(settings.cuda_graphs && !settings.cuda_profile);
        gpu.set_gemm_graphs(
            settings.cuda_graphs && settings.cuda_graph_gemm && !settings.cuda_profile,
        );
        gpu.set_mmq(settings.cuda_mmq);
        gpu.set_flash(settings.cuda_flash);
        gpu.set_attn_v2(settings.cuda_attn_v2);
        gpu.set_gemv_batch(settings.cuda_gemv_batch);
        if let Some(rows) = settings.cuda_gemv_rows {
            gpu.set_gemv_rows(rows);
        }
        gpu.set_mmq_rows(settings.cuda_mmq_rows.unwrap_or(0));
        gpu.set_pdl(
            settings.cuda_pdl && !settings.cuda_profile,
            settings.cuda_pdl_prefetch,
        );
        gpu.set_fuse(settings.cuda_fuse);
        Ok(Self {
            two_level_all: settings.two_level_all,
            gpu,
            inv_freq: Mutex::new(Vec::new()),
            busy: Mutex::new(false),
            idle: Condvar::new(),
        })
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn inv_freq(&self, rope: &RopeParams) -> Result<Arc<DevVec>, ModelError> {
        /// More sets than any family uses: past it, the oldest goes once the device is idle.
        const KEEP: usize = 8;
        let mut sets = self.inv_freq.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, dev)) = sets.iter().find(|(host, _)| *host == rope.inv_freq) {
            return Ok(Arc::clone(dev));
        }
        if sets.len() >= KEEP {
            self.gpu.sync()?;
            sets.remove(0);
        }
        let dev = Arc::new(self.gpu.upload_f32(&rope.inv_freq)?);
        sets.push((rope.inv_freq.clone(), Arc::clone(&dev)));
        Ok(dev)
    }
}

/// The device cache's element type for `t`: f16 or q8_0 (f32 is the reference backend's).
fn kv_elem(t: KvCacheType) -> Result<KvElem, ModelError> {
    match t {
        KvCacheType::F16 => Ok(KvElem::F16),
        KvCacheType::Q8_0 => Ok(KvElem::Q8_0),
        KvCacheType::F32 => Err(ModelError::CacheType {
            cache_type: t.name().into(),
            why: "the CUDA backend keeps f16 or q8_0 (use --cache-type f16 or q8_0)".into(),
        }),
    }
}

/// The device attention's options for one layer: scores scaled by `1/sqrt(head_dim)` (the
/// decoder scales q itself where a family overrides that), and the layer's window.
fn params(attn: AttnSpec) -> AttnParams {
    AttnParams {
        scale: None,
        window: attn.window.unwrap_or(0),
    }
}

impl CudaBackend {
    /// The layer caches, allocated on the first attention call.
    fn kv<'c>(
        &self,
        cache: &'c mut CudaKvCache,
        shape: AttnShape,
    ) -> Result<&'c mut DevKv, ModelError> {
        let s = cache.shape;
        if s.n_head_kv != shape.n_head_kv || s.head_dim != shape.head_dim {
            return Err(ModelError::Tensor {
                what: format!(
                    "attention: cache of {} KV heads × {} for {} × {}",
                    s.n_head_kv, s.head_dim, shape.n_head_kv, shape.head_dim
                ),
            });
        }
        Ok(match &mut cache.kv {
            Some(kv) => kv,
            slot @ None => slot.insert(self.gpu.kv_of(
                kv_elem(s.cache_type)?,
                s.n_layer,
                s.n_ctx,
                s.n_head_kv,
                s.head_dim,
                shape.n_head,
            )?),
        })
    }
}

impl Backend for CudaBackend {
    type Act = DevAct;
    type Matrix = DevMatrix;
    type Vector = DevVec;
    type KvCache = CudaKvCache;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn prepare_matrix(&self, w: &FileTensor) -> Result<DevMatrix, ModelError> {
        let view = w.view()?;
        let wv = view.as_weight()?;
        let mut m = self
            .gpu
            .upload_matrix(wv.dtype, view.bytes()?, wv.rows, wv.cols)
            .map_err(|e| ModelError::Tensor {
                what: format!("{}: {e}", w.name()),
            })?;
        m.two_level = self.two_level_all || two_level(w.name());
        Ok(m)
    }

    fn prepare_vector(&self, w: &FileTensor) -> Result<DevVec, ModelError> {
        Ok(self.gpu.upload_f32(&w.view()?.to_f32_vec()?)?)
    }

    fn alloc(&self, n_tokens: usize, width: usize) -> Result<DevAct, ModelError> {
        Ok(self.gpu.act(n_tokens, width)?)
    }

    fn set_rows(&self, x: &mut DevAct, n_tokens: usize) -> Result<bool, ModelError> {
        Ok(self.gpu.set_rows(x, n_tokens))
    }

    fn new_kv_cache(&self, shape: KvShape) -> Result<CudaKvCache, ModelError> {
        kv_elem(shape.cache_type)?;
        shape.check_cache_type()?;
        Ok(CudaKvCache { shape, kv: None })
    }

    fn begin_forward(&self, n_tokens: usize, pos0: usize) -> Result<(), ModelError> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            busy = self.idle.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        self.gpu.begin(n_tokens, pos0)?;
        *busy = true;
        Ok(())
    }

    fn end_forward(&self) -> Result<(), ModelError> {
        let r = self.gpu.end();
        *self.busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.idle.notify_one();
        Ok(r?)
    }

    fn embed(&self, table: &DevMatrix, ids: &[u32], out: &mut DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.embed(table, ids, out)?)
    }

    fn rms_norm(
        &self,
        x: &DevAct,
        w: &DevVec,
        eps: f32,
        out: &mut DevAct,
    ) -> Result<(), ModelError> {
        Ok(self.gpu.rms_norm(x, w, eps, out)?)
    }

    fn matmul(&self, w: &DevMatrix, x: &DevAct, out: &mut DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.matmul(w, x, out)?)
    }

    fn rope(
        &self,
        x: &mut DevAct,
        n_head: usize,
        _pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        // The position comes from `begin_forward`, through the device inputs buffer.
        let inv = self.inv_freq(rope)?;
        let neox = rope.layout == RopeLayout::Neox;
        Ok(self.gpu.rope(x, n_head, rope.head_dim, &inv, neox)?)
    }

    fn attention(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &mut DevAct,
    ) -> Result<(), ModelError> {
        let kv = self.kv(cache, attn.shape)?;
        Ok(self
            .gpu
            .rope_attention_with(kv, layer, pos0, q, k, v, out, None, params(attn))?)
    }

    fn rope_attention(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        rope: &RopeParams,
        q: &mut DevAct,
        k: &mut DevAct,
        v: &DevAct,
        out: &mut DevAct,
    ) -> Result<(), ModelError> {
        let inv = self.inv_freq(rope)?;
        let neox = rope.layout == RopeLayout::Neox;
        let kv = self.kv(cache, attn.shape)?;
        let rope = Some((&*inv, neox));
        Ok(self
            .gpu
            .rope_attention_with(kv, layer, pos0, q, k, v, out, rope, params(attn))?)
    }

    fn matmul_add(
        &self,
        w: &DevMatrix,
        x: &DevAct,
        acc: &mut DevAct,
        _scratch: &mut DevAct,
    ) -> Result<(), ModelError> {
        Ok(self.gpu.matmul_add(w, x, acc)?)
    }

    fn qkv(
        &self,
        x: &DevAct,
        wq: &DevMatrix,
        wk: &DevMatrix,
        wv: &DevMatrix,
        q: &mut DevAct,
        k: &mut DevAct,
        v: &mut DevAct,
    ) -> Result<(), ModelError> {
        Ok(self.gpu.matmuls(x, &[(wq, q), (wk, k), (wv, v)], false)?)
    }

    fn ffn_gate_up(
        &self,
        x: &DevAct,
        w_gate: &DevMatrix,
        w_up: &DevMatrix,
        act: Activation,
        gate: &mut DevAct,
        up: &mut DevAct,
    ) -> Result<(), ModelError> {
        self.gpu.matmuls(x, &[(w_gate, gate), (w_up, up)], false)?;
        match act {
            Activation::Silu => Ok(self.gpu.swiglu(gate, up)?),
            Activation::GeluTanh => self.geglu(gate, up),
        }
    }

    fn swiglu(&self, gate: &mut DevAct, up: &DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.swiglu(gate, up)?)
    }

    fn geglu(&self, gate: &mut DevAct, up: &DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.geglu(gate, up)?)
    }

    fn add_bias(&self, x: &mut DevAct, b: &DevVec) -> Result<(), ModelError> {
        Ok(self.gpu.add_bias(x, b)?)
    }

    fn rms_norm_heads(
        &self,
        x: &mut DevAct,
        w: &DevVec,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        Ok(self.gpu.rms_norm_heads(x, w, eps, head_dim)?)
    }

    fn scale(&self, x: &mut DevAct, s: f32) -> Result<(), ModelError> {
        Ok(self.gpu.scale(x, s)?)
    }

    fn softcap(&self, x: &mut DevAct, cap: f32) -> Result<(), ModelError> {
        Ok(self.gpu.softcap(x, cap)?)
    }

    fn add(&self, x: &mut DevAct, y: &DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.add(x, y)?)
    }

    fn copy_row(&self, src: &DevAct, row: usize, dst: &mut DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.copy_row(src, row, dst)?)
    }

    fn read(&self, x: &DevAct) -> Result<Vec<f32>, ModelError> {
        Ok(self.gpu.read(x)?)
    }

    fn argmax(&self, x: &DevAct, width: usize) -> Result<Vec<u32>, ModelError> {
        if x.width != width {
            return Err(ModelError::Tensor {
                what: format!("argmax: rows of {} values, expected {width}", x.width),
            });
        }
        Ok(self.gpu.argmax(x)?)
    }

    fn write(&self, x: &mut DevAct, data: &[f32]) -> Result<(), ModelError> {
        Ok(self.gpu.write(x, data)?)
    }

    fn supports_batches(&self) -> bool {
        true
    }

    fn attention_batch(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        attn: AttnSpec,
        rope: &RopeParams,
        batch: &PagedBatch<'_>,
        q: &mut DevAct,
        k: &mut DevAct,
        v: &DevAct,
        out: &mut DevAct,
    ) -> Result<(), ModelError> {
        // A lone sequence over a private cache: the contiguous kernels (the same results, and
        // the position from `begin_forward`, so its decode graph replays at every step).
        if let Some(s) = batch.single_contiguous() {
            return self.rope_attention(cache, layer, attn, s.pos0, rope, q, k, v, out);
        }
        let inv = self.inv_freq(rope)?;
        let neox = rope.layout == RopeLayout::Neox;
        let seqs: Vec<PagedSeq<'_>> = batch
            .seqs
            .iter()
            .map(|s| PagedSeq {
                rows: s.rows.clone(),
                pos0: s.pos0,
                table: s.table,
            })
            .collect();
        let kv = self.kv(cache, attn.shape)?;
        Ok(self.gpu.attention_paged(
            kv,
            layer,
            batch.block_size,
            &seqs,
            q,
            k,
            v,
            out,
            Some((&*inv, neox)),
            params(attn),
        )?)
    }

    fn copy_rows(&self, src: &DevAct, rows: &[usize], dst: &mut DevAct) -> Result<(), ModelError> {
        Ok(self.gpu.copy_rows(src, rows, dst)?)
    }
}

/// Whether the matrix named `name` multiplies two-level q8 activations in the decode GEMV:
/// the Q/K/V projections, as on the CPU (`KernelSettings::two_level_qkv`). One level put the
/// real Gemma 3 270M 0.034 from HF's next-token probabilities on "def fibonacci(n):".
fn two_level(name: &str) -> bool {
    matches!(
        weight_class(name),
        "attn_q" | "attn_k" | "attn_v" | "attn_qkv"
    )
}
