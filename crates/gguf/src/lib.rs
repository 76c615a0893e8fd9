//! GGUF reader and writer: memory-mapped, zero-copy, bounds-checked.
//!
//! Invariant: this crate never panics and never reads out of bounds on untrusted input.
#![forbid(unsafe_code)]
