//! The one error type of the tokenizer crate.

use thiserror::Error;

/// Everything that can go wrong while building a tokenizer, decoding or rendering a template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent.
    #[error("missing tokenizer metadata key `{0}`")]
    MissingKey(&'static str),
    /// A GGUF metadata key has the wrong type or shape.
    #[error("bad tokenizer metadata key `{key}`: {reason}")]
    BadKey {
        /// The metadata key.
        key: &'static str,
        /// What was expected versus found.
        reason: String,
    },
    /// The GGUF reader failed (wrong metadata type, I/O).
    #[error("reading tokenizer metadata: {0}")]
    Gguf(#[from] damascus_gguf::GgufError),
    /// `tokenizer.ggml.model` names a tokenizer family we do not implement.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not implement.
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: llama-bpe, gpt2, qwen2, smollm and aliases)"
    )]
    UnsupportedPreTokenizer(String),
    /// Array lengths disagree (tokens vs token types vs scores).
    #[error("`{key}` has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        /// The metadata key of the shorter or longer array.
        key: &'static str,
        /// The vocabulary size.
        expected: usize,
        /// The array's length.
        found: usize,
    },
    /// A merge rule names a token that is not in the vocabulary, or is malformed.
    #[error("merge rule #{index} `{rule}` is invalid: {reason}")]
    BadMerge {
        /// Position of the rule in the merges list.
        index: usize,
        /// The rule text.
        rule: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A special token id (bos, eos, ...) is outside the vocabulary.
    #[error("{name} token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadSpecialId {
        /// Which special token (`bos`, `eos`, ...).
        name: &'static str,
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// A token id passed to `decode` is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    InvalidToken {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// The vocabulary cannot encode its input (e.g. a byte with no token and no fallback).
    #[error("vocabulary is unusable: {0}")]
    BadVocab(String),
    /// A Hugging Face `tokenizer.json` could not be understood.
    #[error("tokenizer.json: {0}")]
    HfJson(String),
    /// The model has no chat template and none was supplied.
    #[error(
        "the model has no chat template (tokenizer.chat_template); pass one with --chat-template FILE"
    )]
    NoChatTemplate,
    /// `--chat-template NAME` names no built-in template.
    #[error("no built-in chat template {name:?} (built in: {known})")]
    UnknownTemplate {
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// The chat template failed to compile or render (includes `raise_exception` messages).
    #[error("chat template: {0:#}")]
    Template(#[from] minijinja::Error),
    /// Chat messages are not a JSON list of objects.
    #[error("chat messages: {0}")]
    Messages(String),
}

/// Result alias of this crate.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
