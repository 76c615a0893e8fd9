//! Model semantics: config from GGUF metadata, weights, the Llama decoder, the KV cache
//! and the backend seam.
#![forbid(unsafe_code)]

pub mod config;
pub mod error;

pub use error::ModelError;
