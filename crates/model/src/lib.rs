//! Model semantics: config from GGUF metadata, weights, the Llama decoder, the KV cache
//! and the backend seam.
//!
//! * [`tensor`]: zero-copy tensor views over the mapped file or host memory.
//! * [`backend`]: the [`Backend`](backend::Backend) trait and the scalar reference backend.
//! * [`decoder`]: the Llama forward pass, generic over the backend.
//! * [`params`]: hyper-parameters as the decoder uses them.
//! * [`kv_pool`]: the KV cache as a pool of blocks (block tables, prefix cache, LRU eviction).
//! * [`batch`]: batched forward passes of many sequences over one paged KV cache.
//! * [`verify`]: comparison against Hugging Face forward-pass fixtures.
//! * [`session`]: the [`Model`] / [`Session`] façade the runtime and CLI use.
#![forbid(unsafe_code)]

pub mod backend;
pub mod batch;
pub mod config;
pub mod decoder;
pub mod embed;
pub mod error;
pub mod family;
pub mod kv_pool;
pub mod params;
pub mod session;
pub mod tensor;
pub mod verify;

pub use backend::KvCacheType;
pub use error::ModelError;
pub use session::{BackendKind, LoadOptions, Model, Session};
