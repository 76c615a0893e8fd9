//! GGUF metadata keys: the shared ones from [`damascus_gguf::keys`], plus the few only this
//! crate touches.

pub use damascus_gguf::keys::*;

/// `split.no` (u16): removed when quantizing (llama-quantize writes one file).
pub const SPLIT_NO: &str = "split.no";
/// `split.count` (u16).
pub const SPLIT_COUNT: &str = "split.count";
/// `split.tensors.count` (i32).
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
/// `damascus.synth.shape` (string): provenance of a synthetic model.
pub const DAMASCUS_SYNTH_SHAPE: &str = "damascus.synth.shape";
/// `damascus.synth.seed` (u64): provenance of a synthetic model.
pub const DAMASCUS_SYNTH_SEED: &str = "damascus.synth.seed";
