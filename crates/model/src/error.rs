//! The error type of the model crate.

/// Errors from loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file could not be read or is malformed.
    #[error(transparent)]
    Gguf(#[from] damascus_gguf::GgufError),
    /// A required metadata key is absent.
    #[error("metadata key {key} is missing{hint}")]
    MissingKey {
        /// The key.
        key: String,
        /// Extra context (may be empty), starting with "; ".
        hint: String,
    },
    /// A metadata value is present but unusable.
    #[error("metadata key {key}: {message}")]
    BadConfig {
        /// The key (or keys) involved.
        key: String,
        /// What is wrong, with the values found.
        message: String,
    },
    /// The architecture is not one Damascus runs.
    #[error(
        "unsupported architecture {arch:?} (general.architecture); supported: {}",
        crate::family::SUPPORTED_ARCHS.join(", ")
    )]
    UnsupportedArch {
        /// The value of `general.architecture`.
        arch: String,
    },
    /// A tensor's shape disagrees with the config.
    #[error("tensor {name}: expected shape {expected:?}, found {found:?} ({why})")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected dims (ggml order: row length first).
        expected: Vec<u64>,
        /// Dims in the file.
        found: Vec<u64>,
        /// Which config values the expectation comes from.
        why: String,
    },
    /// A tensor that the config says cannot exist (e.g. a layer past `block_count`).
    #[error("unexpected tensor {name}: {why}")]
    UnexpectedTensor {
        /// Tensor name.
        name: String,
        /// Why it is unexpected.
        why: String,
    },
    /// A required tensor is absent.
    #[error("tensor {name} is missing from the model")]
    MissingTensor {
        /// Tensor name.
        name: String,
    },
    /// A tensor or activation has the wrong shape or type for the operation.
    #[error("tensor shape: {what}")]
    Tensor {
        /// What is wrong, with names and expected vs found.
        what: String,
    },
    /// A KV cache element type this backend or model cannot hold (e.g. q8_0 with a head size
    /// that is not a multiple of 32, or on CUDA).
    #[error("KV cache type {cache_type}: {why}")]
    CacheType {
        /// The type asked for (`q8_0`, ...).
        cache_type: String,
        /// Why it cannot be used, and what to use instead.
        why: String,
    },
    /// A KV cache in host memory larger than the machine's memory and swap.
    #[error(
        "a KV cache of {positions} positions ({cache_type}) takes {need_gib:.1} GiB, more than \
         this machine's {have_gib:.1} GiB of memory and swap: lower the context (-c, or -d in bench)"
    )]
    KvTooLarge {
        /// Positions asked for.
        positions: usize,
        /// The cache's element type (`f16`, ...).
        cache_type: String,
        /// GiB the cache would take.
        need_gib: f64,
        /// GiB of memory and swap the machine has.
        have_gib: f64,
    },
    /// A kernel rejected its data (e.g. an unsupported weight type).
    #[error(transparent)]
    Kernel(#[from] damascus_kernels::reference::KernelError),
    /// A forward pass would run past the KV cache.
    #[error(
        "context full: {n_past} positions used + {n_tokens} new > context length {n_ctx} \
         (raise it with -c)"
    )]
    ContextFull {
        /// Capacity of the KV cache.
        n_ctx: usize,
        /// Positions already in the cache.
        n_past: usize,
        /// Tokens in the rejected batch.
        n_tokens: usize,
    },
    /// `eval` was called with no tokens.
    #[error("no tokens to evaluate")]
    EmptyInput,
    /// A token id is outside the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {n_vocab}")]
    TokenOutOfRange {
        /// The token id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The CUDA side failed (no device, a driver call, a kernel compile).
    #[error(transparent)]
    Cuda(#[from] damascus_cuda::CudaError),
    /// The requested backend is not available on this machine or build.
    #[error("backend {name} is not available: {why}")]
    BackendUnavailable {
        /// Backend name.
        name: String,
        /// Why.
        why: String,
    },
    /// A forward-pass fixture (from `tools/hf_fixtures.py`) could not be read.
    #[error("fixture {}: {what}", path.display())]
    Fixture {
        /// The fixture file.
        path: std::path::PathBuf,
        /// What is wrong.
        what: String,
    },
}
