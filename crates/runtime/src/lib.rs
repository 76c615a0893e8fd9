//! Generation runtime: sampler chain, generation loop, stop conditions, sessions.
//!
//! - [`sampler`]: a llama.cpp-style chain of small sampling stages (penalties, top-k, typical-p,
//!   top-p, min-p, temperature, then a final greedy / random pick), plus log-probability helpers.
//! - [`stop`]: user stop strings matched across token boundaries on streamed text.
#![forbid(unsafe_code)]

pub mod sampler;
pub mod stop;

/// Errors of the runtime crate.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A name in a `--samplers` order string that is not a sampler at all.
    #[error("unknown sampler '{name}' in sampler order; known names: {known}")]
    UnknownSampler {
        /// The name as given by the user.
        name: String,
        /// Comma-separated list of the accepted names.
        known: String,
    },
    /// A llama.cpp sampler name that Damascus recognises but does not implement.
    #[error(
        "sampler '{name}' exists in llama.cpp but is not implemented by damascus; \
         supported: {supported}"
    )]
    UnsupportedSampler {
        /// The name as given by the user.
        name: String,
        /// Comma-separated list of the supported names.
        supported: String,
    },
    /// A sampler parameter outside its valid range.
    #[error("invalid sampler parameter {param} = {value}: {reason}")]
    InvalidSamplerParam {
        /// Parameter name (e.g. `top_p`).
        param: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What the valid range is.
        reason: &'static str,
    },
    /// The logits handed to the sampler were empty.
    #[error("cannot sample from empty logits (n_vocab = 0)")]
    EmptyLogits,
    /// Every candidate was filtered out before a token could be picked (a custom chain bug).
    #[error("no candidate token left after the sampler stages: {chain}")]
    NoCandidates {
        /// The chain description, for context.
        chain: String,
    },
}
