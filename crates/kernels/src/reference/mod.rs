//! Scalar f32 reference kernels: the oracle every faster kernel is tested against.
//!
//! Written for clarity, not speed: plain loops, one concern per function, a shape comment on
//! every argument. Shapes are row-major and written outermost first, so `[n_tokens, n_embd]`
//! means `n_tokens` rows of `n_embd` contiguous values.
//!
//! * [`matmul`]: `y = x · Wᵀ` over any weight type, dequantizing one weight row at a time.
//! * [`embed_rows`]: row lookup in a (possibly quantized) embedding table.
//! * [`rms_norm`], [`softmax`], [`silu`], [`swiglu`], [`gelu_tanh`], [`geglu`], [`add`],
//!   [`add_bias`], [`softcap`]: element-wise and row ops.
//! * [`rope`]: rotary embeddings in both layouts ([`RopeLayout`]), with llama3 frequency scaling.
//! * [`attention`], [`attention_window`]: causal grouped-query attention over a KV cache, with
//!   an optional sliding window.
//!
//! Shape mismatches between arguments are caller bugs and panic with a message; problems with
//! the data itself (an unsupported weight type, a short byte buffer) are returned as
//! [`KernelError`].

mod attention;
mod matmul;
mod ops;
mod rope;
#[cfg(test)]
mod tests;

pub use attention::{AttnShape, attention, attention_window};
pub use matmul::{WeightView, embed_rows, matmul};
pub use ops::{add, add_bias, geglu, gelu_tanh, rms_norm, silu, softcap, softmax, swiglu};
pub use rope::{
    RopeLayout, RopeScalingLlama3, llama3_freq_factors, rope, rope_angles, rope_inv_freq,
    rope_rotate,
};

/// Errors of the reference kernels: problems with the weight data, never with shapes.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A weight row could not be dequantized.
    #[error("dequantizing row {row} of a {dtype} weight: {source}")]
    Dequant {
        /// Row index inside the weight matrix.
        row: usize,
        /// Weight type.
        dtype: damascus_quant::GgmlType,
        /// The underlying error.
        source: damascus_quant::QuantError,
    },
    /// The byte buffer of a weight does not match its shape and type.
    #[error("{dtype} weight [{rows}, {cols}] needs {expected} bytes, found {found}")]
    WeightBytes {
        /// Weight type.
        dtype: damascus_quant::GgmlType,
        /// Rows of the matrix.
        rows: usize,
        /// Columns of the matrix (elements per row).
        cols: usize,
        /// Bytes the shape requires.
        expected: usize,
        /// Bytes provided.
        found: usize,
    },
    /// A token id is outside the embedding table.
    #[error("token id {id} is out of range for a vocabulary of {n_vocab}")]
    TokenOutOfRange {
        /// The token id.
        id: u32,
        /// Rows of the embedding table.
        n_vocab: usize,
    },
}
