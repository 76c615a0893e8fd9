//! The error type of the conversion crate.

use std::path::PathBuf;

use damascus_gguf::GgmlType;

/// Errors from quantizing or synthesizing a model.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The input GGUF could not be parsed, or the output could not be serialized.
    #[error("{}: {source}", path.display())]
    Gguf {
        /// The file involved.
        path: PathBuf,
        /// The GGUF error.
        #[source]
        source: damascus_gguf::GgufError,
    },
    /// The output would overwrite the input.
    #[error("refusing to overwrite the input file {} (output {} is the same file)", input.display(), output.display())]
    SameFile {
        /// Input path.
        input: PathBuf,
        /// Output path.
        output: PathBuf,
    },
    /// The file type has no recipe.
    #[error(transparent)]
    Recipe(#[from] damascus_quant::recipe::RecipeError),
    /// A required metadata key is missing or has the wrong type.
    #[error("metadata key {key}: {reason}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor is already quantized and `--allow-requantize` was not given.
    #[error(
        "tensor {tensor} is already quantized ({from}); requantizing to {to} loses quality, pass --allow-requantize to do it anyway"
    )]
    RequantizeDisabled {
        /// Tensor name.
        tensor: String,
        /// Its current type.
        from: GgmlType,
        /// The planned type.
        to: GgmlType,
    },
    /// A type cannot be read or written.
    #[error("tensor {tensor}: cannot convert {from} -> {to} (unsupported type)")]
    Unsupported {
        /// Tensor name.
        tensor: String,
        /// Source type.
        from: GgmlType,
        /// Target type.
        to: GgmlType,
    },
    /// A tensor shape does not fit its type.
    #[error("tensor {tensor}: {reason}")]
    Shape {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// Converting rows of a tensor failed.
    #[error("tensor {tensor} -> {to}: {reason}")]
    Convert {
        /// Tensor name.
        tensor: String,
        /// Target type.
        to: GgmlType,
        /// What failed.
        reason: String,
    },
    /// The tokenizer file is not usable.
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer.json path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The run was cancelled (Ctrl-C) before the output was complete.
    #[error("cancelled; {} was not written", output.display())]
    Cancelled {
        /// The output that was not written.
        output: PathBuf,
    },
    /// An unknown synthetic shape name.
    #[error("unknown shape {0:?} (known: llama-3.2-3b, llama-3.2-1b, tiny-llama3)")]
    UnknownShape(String),
}
