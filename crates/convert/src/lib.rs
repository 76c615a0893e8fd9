//! Model conversion: llama.cpp-compatible quantization of GGUF files (`damascus quantize`) and
//! seeded synthetic Llama models (`damascus synth`).
//!
//! Both paths share one pipeline: a per-tensor type [plan](damascus_quant::recipe::plan), a
//! row-parallel f32 → target encoder ([`rows`]), and the streaming GGUF writer, writing to a
//! temporary file next to the output that is renamed into place only after everything
//! succeeded ([`output`]).
//!
//! Invariants: the input file is never written; a failed or interrupted run never leaves a
//! partial file under the output name.
#![forbid(unsafe_code)]

mod error;
mod keys;
pub mod output;
pub mod quantize;
pub mod rng;
pub mod rows;
pub mod synth;
pub mod vocab;

pub use error::ConvertError;
pub use quantize::{QuantizeOptions, QuantizeSummary, quantize_file};
pub use synth::{Shape, SynthOptions, SynthSummary, synth_model};

/// Default seed of `damascus synth` (the benchmark model is generated with it).
pub const DEFAULT_SEED: u64 = 0x5EED_DA7A;

/// Progress reporting hooks; all elements of all tensors are counted.
///
/// Called from worker threads, hence `Sync`.
pub trait Progress: Sync {
    /// Work of `total_elements` elements in `n_tensors` tensors begins.
    fn start(&self, total_elements: u64, n_tensors: usize);
    /// Tensor `index` named `name` begins (converted to `dtype`).
    fn tensor(&self, index: usize, name: &str, dtype: damascus_gguf::GgmlType);
    /// `n` more elements are done.
    fn advance(&self, n: u64);
    /// All tensors are written.
    fn finish(&self);
    /// Polled by the workers: `true` stops the run (Ctrl-C); the temporary output file is
    /// removed and the output path is left untouched.
    fn is_cancelled(&self) -> bool {
        false
    }
}

/// A [`Progress`] that reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: u64, _: usize) {}
    fn tensor(&self, _: usize, _: &str, _: damascus_gguf::GgmlType) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

/// The number of worker threads to use when the user did not say: all available cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
