//! GGUF reader and writer: memory-mapped, zero-copy, bounds-checked.
//!
//! - [`GgufFile`] parses a GGUF v2/v3 file (little-endian) from a memory map or a byte vector,
//!   validates every count, offset and size against the file, and hands out tensor data as
//!   slices of the mapping.
//! - [`GgufWriter`] writes GGUF v3, streaming tensor data one tensor at a time.
//! - [`GgmlType`] knows the block layout of every ggml type; [`FileType`] names llama.cpp's
//!   file types; [`keys`] holds every metadata key and tensor name other crates use.
//!
//! Invariant: this crate never panics and never reads out of bounds on untrusted input; the
//! only `unsafe` is the `mmap` call in [`GgufFile::open`].
#![deny(unsafe_code)]

mod error;
mod file_type;
mod fuzzing;
pub mod keys;
mod metadata;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file_type::{FILE_TYPE_GUESSED, FileType};
#[doc(hidden)]
pub use fuzzing::fuzz_harness;
pub use metadata::Metadata;
pub use reader::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufFile, MAX_DIMS, MAX_NESTING_DEPTH, TensorInfo,
};
pub use types::GgmlType;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, WRITE_VERSION};
