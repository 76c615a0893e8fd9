//! The façade other crates use: [`Model`] (a loaded file and its prepared weights) and
//! [`Session`] (one sequence: a KV cache and a position), independent of the backend type.

use std::path::Path;
use std::sync::Arc;

use damascus_gguf::GgufFile;
use damascus_kernels::settings::KernelSettings;

use crate::backend::cpu::CpuBackend;
use crate::backend::reference::ReferenceBackend;
use crate::backend::{Backend, KvCacheType};
use crate::batch::{PagedCache, PagedState, SeqInput, StepOut};
use crate::config::ModelConfig;
use crate::decoder::{Decoder, DecoderState, HiddenHook, PagedKv};
use crate::error::ModelError;
use crate::params::DecoderParams;

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// The fastest backend available on this machine.
    #[default]
    Auto,
    /// The scalar f32 reference (no activation quantization): slow, the oracle.
    Reference,
    /// The multithreaded SIMD CPU backend ([`crate::backend::cpu::CpuBackend`]) on
    /// `n_threads` threads (`None`: one per physical core).
    Cpu {
        /// Threads, the caller included.
        n_threads: Option<usize>,
    },
    /// The CUDA backend (`backend::cuda`, feature `cuda`) on device `device`.
    Cuda {
        /// Device ordinal.
        device: usize,
        /// Decoder layers on the GPU (`--ngl`): `None`, or at least the model's layer count,
        /// puts the whole model there; fewer runs the last `n` layers on the GPU and the rest
        /// (embeddings, leading layers, LM head) on the CPU backend
        /// ([`crate::backend::split::Split`]); 0 runs everything on the CPU.
        n_gpu_layers: Option<usize>,
        /// Threads of the CPU part of a split.
        n_threads: Option<usize>,
    },
}

/// Options for [`Model::load`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Context length (KV cache positions) of new sessions; default
    /// `min(n_ctx_train, 4096)`.
    pub n_ctx: Option<usize>,
    /// Backend choice.
    pub backend: BackendKind,
    /// KV cache element type; `None`: the backend's default (f16 on the fast CPU path, f32 on
    /// the reference).
    pub cache_type: Option<KvCacheType>,
    /// Keep every weight in the file's layout on the CPU backend (no load-time repacking; the
    /// same as `DAMASCUS_REPACK=0`).
    pub no_repack: bool,
    /// Tuning settings of the CPU kernels and backend (the process-wide ones take effect
    /// through [`KernelSettings::install`]).
    pub kernel: KernelSettings,
}

/// Default context length when the user gives none.
pub const DEFAULT_N_CTX: usize = 4096;

/// Backend-erased decoder: what a [`Model`] holds.
trait Engine: Send + Sync {
    fn backend_name(&self) -> &'static str;
    fn default_cache_type(&self) -> KvCacheType;
    fn load_note(&self) -> Option<String>;
    fn new_session(
        &self,
        n_ctx: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<Box<dyn SessionState>, ModelError>;
    fn supports_batches(&self) -> bool;
    fn new_paged(
        &self,
        n_blocks: usize,
        block_size: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<Box<dyn PagedState>, ModelError>;
}

/// Backend-erased per-sequence state: what a [`Session`] holds.
trait SessionState: Send {
    fn eval(&mut self, ids: &[u32], hook: Option<HiddenHook<'_>>) -> Result<Vec<f32>, ModelError>;
    fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32, ModelError>;
    fn eval_all(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError>;
    fn eval_all_argmax(&mut self, ids: &[u32]) -> Result<Vec<u32>, ModelError>;
    fn row_invariant(&self) -> bool;
    fn n_past(&self) -> usize;
    fn n_ctx(&self) -> usize;
    fn truncate(&mut self, n: usize);
}

impl<B: Backend> Engine for Arc<Decoder<B>> {
    fn backend_name(&self) -> &'static str {
        self.backend().name()
    }

    fn default_cache_type(&self) -> KvCacheType {
        self.backend().default_cache_type()
    }

    fn load_note(&self) -> Option<String> {
        self.backend().load_note()
    }

    fn new_session(
        &self,
        n_ctx: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<Box<dyn SessionState>, ModelError> {
        let state = self.new_state_with(n_ctx, cache_type)?;
        Ok(Box::new(SessionOf {
            decoder: Arc::clone(self),
            state,
        }))
    }

    fn supports_batches(&self) -> bool {
        self.backend().supports_batches()
    }

    fn new_paged(
        &self,
        n_blocks: usize,
        block_size: usize,
        cache_type: Option<KvCacheType>,
    ) -> Result<Box<dyn PagedState>, ModelError> {
        let kv = self.new_paged_kv(n_blocks, block_size, cache_type)?;
        Ok(Box::new(PagedOf {
            decoder: Arc::clone(self),
            kv,
        }))
    }
}

struct PagedOf<B: Backend> {
    decoder: Arc<Decoder<B>>,
    kv: PagedKv<B>,
}

impl<B: Backend> PagedState for PagedOf<B> {
    fn forward(&mut self, seqs: &[SeqInput<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.decoder.forward_batch(&mut self.kv, seqs)
    }

    fn forward_picks(
        &mut self,
        seqs: &[SeqInput<'_>],
        greedy: &[bool],
    ) -> Result<Vec<StepOut>, ModelError> {
        self.decoder.forward_batch_picks(&mut self.kv, seqs, greedy)
    }
}

struct SessionOf<B: Backend> {
    decoder: Arc<Decoder<B>>,
    state: DecoderState<B>,
}

impl<B: Backend> SessionState for SessionOf<B> {
    fn eval(&mut self, ids: &[u32], hook: Option<HiddenHook<'_>>) -> Result<Vec<f32>, ModelError> {
        self.decoder.forward(&mut self.state, ids, hook)
    }

    fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32, ModelError> {
        self.decoder.forward_argmax(&mut self.state, ids)
    }

    fn eval_all(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.decoder.forward_all(&mut self.state, ids)
    }

    fn eval_all_argmax(&mut self, ids: &[u32]) -> Result<Vec<u32>, ModelError> {
        self.decoder.forward_all_argmax(&mut self.state, ids)
    }

    fn row_invariant(&self) -> bool {
        self.decoder.backend().supports_batches()
    }

    fn n_past(&self) -> usize {
        self.state.n_past()
    }

    fn n_ctx(&self) -> usize {
        self.state.n_ctx()
    }

    fn truncate(&mut self, n: usize) {
        self.state.truncate(n);
    }
}

/// A loaded model: the mapped file, its config and the weights prepared on a backend.
/// Cheap to share between threads; create a [`Session`] per sequence.
pub struct Model {
    file: Arc<GgufFile>,
    config: ModelConfig,
    params: DecoderParams,
    n_ctx: usize,
    cache_type: Option<KvCacheType>,
    engine: Box<dyn Engine>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("file", &self.file)
            .field("backend", &self.engine.backend_name())
            .field("n_ctx", &self.n_ctx)
            .finish()
    }
}

impl Model {
    /// Opens (memory-maps) a GGUF file and loads it.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_file(file, opts)
    }

    /// Loads an already opened GGUF file on the backend `opts.backend` selects.
    pub fn from_file(file: Arc<GgufFile>, opts: &LoadOptions) -> Result<Model, ModelError> {
        match opts.backend {
            BackendKind::Reference => Self::with_backend(file, opts, ReferenceBackend),
            BackendKind::Auto => Self::with_backend(
                file,
                opts,
                CpuBackend::with_settings(None, &opts.kernel).with_repack(!opts.no_repack),
            ),
            BackendKind::Cpu { n_threads } => Self::with_backend(
                file,
                opts,
                CpuBackend::with_settings(n_threads, &opts.kernel).with_repack(!opts.no_repack),
            ),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda {
                device,
                n_gpu_layers,
                n_threads,
            } => {
                let config = ModelConfig::from_gguf(&file)?;
                let n_layer = config.n_layer as usize;
                let kernel = config.spec.kernel_settings(&opts.kernel);
                match n_gpu_layers {
                    Some(0) => Self::with_backend(
                        file,
                        opts,
                        CpuBackend::with_settings(n_threads, &opts.kernel)
                            .with_repack(!opts.no_repack),
                    ),
                    Some(n) if n < n_layer => {
                        let gpu =
                            crate::backend::cuda::CudaBackend::with_settings(device, &kernel)?;
                        let split = crate::backend::split::Split::new(
                            CpuBackend::with_settings(n_threads, &opts.kernel)
                                .with_repack(!opts.no_repack),
                            gpu,
                            n_layer,
                            n,
                        );
                        Self::with_backend(file, opts, split)
                    }
                    _ => {
                        let backend =
                            crate::backend::cuda::CudaBackend::with_settings(device, &kernel)?;
                        Self::with_backend(file, opts, backend)
                    }
                }
            }
            #[cfg(not(feature = "cuda"))]
            BackendKind::Cuda { .. } => Err(damascus_cuda::CudaError::NotBuilt.into()),
        }
    }

    /// Loads an already opened GGUF file on an explicit backend (`opts.backend` is ignored):
    /// how new backends are plugged in and tested against the reference.
    pub fn with_backend<B: Backend>(
        file: Arc<GgufFile>,
        opts: &LoadOptions,
        backend: B,
    ) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        config.check_tensors(&file)?;
        let params = crate::params::from_config(&config)?;
        params.validate()?;
        let n_ctx = match opts.n_ctx {
            Some(0) => {
                return Err(ModelError::BadConfig {
                    key: "n_ctx".into(),
                    message: "the context length must be at least 1".into(),
                });
            }
            Some(n) => n,
            None => DEFAULT_N_CTX.min(config.n_ctx_train as usize).max(1),
        };
        // A cache type the model's head size cannot take fails here, not at the first request.
        if let Some(cache_type) = opts.cache_type {
            crate::backend::KvShape {
                n_layer: params.n_layer,
                n_ctx,
                n_head_kv: params.n_head_kv,
                head_dim: params.head_dim,
                cache_type,
            }
            .check_cache_type()?;
        }
        let decoder = Decoder::load(backend, &file, params.clone())?;
        let engine: Box<dyn Engine> = Box::new(Arc::new(decoder));
        Ok(Model {
            file,
            config,
            params,
            n_ctx,
            cache_type: opts.cache_type,
            engine,
        })
    }

    /// The model's configuration from its metadata.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Hyper-parameters as the decoder uses them.
    pub fn params(&self) -> &DecoderParams {
        &self.params
    }

    /// The underlying GGUF file (metadata, tokenizer tables).
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Context length of new sessions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Name of the backend running the model.
    pub fn backend_name(&self) -> &'static str {
        self.engine.backend_name()
    }

    /// The element type of new KV caches (the one asked for at load, else the backend's
    /// default).
    pub fn cache_type(&self) -> KvCacheType {
        self.cache_type
            .unwrap_or_else(|| self.engine.default_cache_type())
    }

    /// Bytes one position of a KV cache takes (keys and values of every layer) in
    /// [`Model::cache_type`]: what `-c` positions cost.
    pub fn kv_bytes_per_slot(&self) -> usize {
        crate::backend::KvShape {
            n_layer: self.params.n_layer,
            n_ctx: 1,
            n_head_kv: self.params.n_head_kv,
            head_dim: self.params.head_dim,
            cache_type: self.cache_type(),
        }
        .bytes_per_slot()
    }

    /// What loading did beyond mapping the file (e.g. repacking weights, and how long it took),
    /// if anything: [`Backend::load_note`].
    pub fn load_note(&self) -> Option<String> {
        self.engine.load_note()
    }

    /// The context length the model was trained with.
    pub fn n_ctx_train(&self) -> usize {
        self.config.n_ctx_train as usize
    }

    /// Whether the backend runs many sequences in one forward pass over a shared paged KV
    /// cache ([`Model::paged_cache`]).
    pub fn supports_batches(&self) -> bool {
        self.engine.supports_batches()
    }

    /// A KV cache of `n_blocks` blocks of `block_size` positions shared by many sequences,
    /// with batched forward passes over it (see [`crate::batch`]). Fails on backends that do
    /// not batch ([`Model::supports_batches`]).
    pub fn paged_cache(
        &self,
        n_blocks: usize,
        block_size: usize,
    ) -> Result<PagedCache, ModelError> {
        if n_blocks == 0 || block_size == 0 {
            return Err(ModelError::BadConfig {
                key: "n_ctx".into(),
                message: "the shared KV cache needs at least one block".into(),
            });
        }
        Ok(PagedCache {
            inner: self
                .engine
                .new_paged(n_blocks, block_size, self.cache_type)?,
            n_blocks,
            block_size,
        })
    }

    /// A new, empty sequence with a KV cache of [`Model::n_ctx`] positions.
    pub fn session(&self) -> Result<Session, ModelError> {
        self.session_with_n_ctx(self.n_ctx)
    }

    /// A new, empty sequence with a KV cache of `n_ctx` positions.
    pub fn session_with_n_ctx(&self, n_ctx: usize) -> Result<Session, ModelError> {
        if n_ctx == 0 {
            return Err(ModelError::BadConfig {
                key: "n_ctx".into(),
                message: "the context length must be at least 1".into(),
            });
        }
        Ok(Session {
            inner: self.engine.new_session(n_ctx, self.cache_type)?,
        })
    }
}

/// One sequence being evaluated: a KV cache and the number of positions in it.
pub struct Session {
    inner: Box<dyn SessionState>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("n_past", &self.n_past())
            .field("n_ctx", &self.n_ctx())
            .finish()
    }
}

impl Session {
    /// Appends `ids` (a whole prompt in one pass, or one token) and returns the `[n_vocab]`
    /// logits of the last one. Fails with [`ModelError::ContextFull`] past the context length.
    pub fn eval(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.inner.eval(ids, None)
    }

    /// Like [`Session::eval`], returning only the greedy pick (the index of the largest
    /// logit; NaN never wins, ties go to the lowest id). On a device backend the logits stay
    /// on the device.
    pub fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32, ModelError> {
        self.inner.eval_argmax(ids)
    }

    /// Appends `ids` like [`Session::eval`] and returns the `[n_vocab]` logits after every one
    /// of them (`ids.len()` rows): the verify pass of speculative decoding.
    pub fn eval_all(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.inner.eval_all(ids)
    }

    /// Like [`Session::eval_all`], returning only the greedy pick after every one of `ids`.
    pub fn eval_all_argmax(&mut self, ids: &[u32]) -> Result<Vec<u32>, ModelError> {
        self.inner.eval_all_argmax(ids)
    }

    /// Whether every row of a multi-token pass gets the same logits as passes of one token at
    /// a time at the same positions (backends with batched attention: the CPU backends; bit
    /// for bit below [`crate::backend::cpu::GEMM_MIN_TOKENS`] rows, and above it too except
    /// on AMX prompt tiles). Speculative decoding relies on it to match plain decoding.
    pub fn row_invariant(&self) -> bool {
        self.inner.row_invariant()
    }

    /// Like [`Session::eval`], calling `hook` with every hidden state (embeddings, each
    /// layer's output, the final norm).
    pub fn eval_with_hook(
        &mut self,
        ids: &[u32],
        hook: HiddenHook<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        self.inner.eval(ids, Some(hook))
    }

    /// Positions already evaluated.
    pub fn n_past(&self) -> usize {
        self.inner.n_past()
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// Keeps only the first `n` positions (for reusing a shared prefix).
    pub fn truncate(&mut self, n: usize) {
        self.inner.truncate(n);
    }

    /// Forgets every position.
    pub fn reset(&mut self) {
        self.inner.truncate(0);
    }
}
