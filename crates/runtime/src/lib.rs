//! Generation runtime: sampler chain, generation loop, stop conditions, sessions.
//!
//! - [`sampler`]: a llama.cpp-style chain of small sampling stages (penalties, top-k, typical-p,
//!   top-p, min-p, temperature, then a final greedy / random pick), plus log-probability helpers.
//! - [`stop`]: user stop strings matched across token boundaries on streamed text.
//! - [`sequence`]: a model session plus the ids in its KV cache (prefix reuse, context shift).
//! - [`generate`]: the I/O-free generation loop ([`generate::Generator`]) with events, stop
//!   reasons, timings and cancellation.
//! - [`lookup`]: prompt-lookup drafting (n-gram matches in the context) for speculative
//!   decoding, verified by the generation loop in one forward pass.
//! - [`chat`]: multi-turn chat through the model's template, reusing the KV cache per turn.
#![forbid(unsafe_code)]

pub mod chat;
pub mod generate;
pub mod lookup;
pub mod sampler;
pub mod sequence;
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
    /// A speculative-decoding setting outside its valid range.
    #[error("invalid --{param} {value}: {reason}")]
    InvalidDraftParam {
        /// Flag name without dashes (e.g. `draft-max`).
        param: &'static str,
        /// The offending value.
        value: usize,
        /// What the valid range is.
        reason: &'static str,
    },
    /// The logits handed to the sampler were empty.
    #[error("cannot sample from empty logits (n_vocab = 0)")]
    EmptyLogits,
    /// A prompt with no tokens.
    #[error("the prompt is empty (no tokens to evaluate)")]
    EmptyPrompt,
    /// The prompt alone does not fit in the context.
    #[error(
        "the prompt has {n_prompt} tokens but the context holds only {n_ctx}; \
         use a larger -c/--ctx-size or a shorter prompt"
    )]
    PromptTooLong {
        /// Prompt length in tokens.
        n_prompt: usize,
        /// Context length.
        n_ctx: usize,
    },
    /// The KV cache has no room for the tokens to evaluate.
    #[error(
        "context full: {n_past} of {n_ctx} positions used, {n_tokens} more needed \
         (use a larger -c/--ctx-size, /reset, or --context-shift)"
    )]
    ContextFull {
        /// Capacity of the KV cache.
        n_ctx: usize,
        /// Positions already used.
        n_past: usize,
        /// Tokens that did not fit.
        n_tokens: usize,
    },
    /// `step` was driven past [`generate::Event::Done`].
    #[error("the generator already finished")]
    GeneratorFinished,
    /// A chat message list the template cannot render (e.g. no user turn to answer).
    #[error("chat: {0}")]
    Chat(String),
    /// An error of the model (forward pass, KV cache).
    #[error(transparent)]
    Model(#[from] damascus_model::ModelError),
    /// An error of the tokenizer (bad id, template rendering).
    #[error(transparent)]
    Tokenizer(#[from] damascus_tokenizer::TokenizerError),
    /// The model's logits hold NaN or infinities (corrupt or overflowing weights).
    #[error(
        "the model produced {n_bad} non-finite logits (NaN or inf) of {n_vocab}; its weights \
         may be corrupt (try `damascus load`, or --reference to compare)"
    )]
    NonFiniteLogits {
        /// NaN or infinite logits in the row.
        n_bad: usize,
        /// Row length.
        n_vocab: usize,
    },
    /// Every candidate was filtered out before a token could be picked (a custom chain bug).
    #[error("no candidate token left after the sampler stages: {chain}")]
    NoCandidates {
        /// The chain description, for context.
        chain: String,
    },
}
