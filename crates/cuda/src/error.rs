//! The crate's one error type.

/// What can go wrong on the CUDA path. Every failure is an error value, never a panic:
/// a missing driver, NVRTC or cuBLAS library is [`CudaError::NoDevice`].
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// This build was made without the `cuda` feature.
    #[error("this build has no CUDA support (rebuild with `--features cuda`)")]
    NotBuilt,
    /// No usable device: no driver, no GPU, or a CUDA library missing.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver, NVRTC or cuBLAS call failed.
    #[error("CUDA {op}: {message}")]
    Call {
        /// What was being done.
        op: String,
        /// The library's message.
        message: String,
    },
    /// Kernel compilation failed (NVRTC's log).
    #[error("compiling the CUDA kernels failed:\n{0}")]
    Compile(String),
    /// A buffer or matrix does not have the shape an op needs.
    #[error("CUDA shape: {0}")]
    Shape(String),
}

impl CudaError {
    /// A failed library call, with what was being done.
    pub fn call(op: impl Into<String>, e: impl std::fmt::Display) -> Self {
        CudaError::Call {
            op: op.into(),
            message: e.to_string(),
        }
    }
}
