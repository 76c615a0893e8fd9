//! The CUDA side of Damascus: kernels written in CUDA C (`kernels/damascus.cu`), compiled at
//! run time with NVRTC for the device's architecture and cached on disk by hash, and a safe
//! Rust surface over them for the model's CUDA backend (`damascus_model::backend::cuda`).
//!
//! * [`layout`]: how each weight type is laid out on the device (pure host code, tested
//!   everywhere).
//! * [`kv_layout`]: the KV cache's element types (f16, q8_0) and layout on the device (pure
//!   host code, with the host twin of the kernels' cache reads).
//! * `gpu` (feature `cuda`): the device, its buffers, the recorded ops and decode graphs.
//!
//! Nothing links against CUDA at build time: with the `cuda` feature the driver, NVRTC and
//! cuBLAS are loaded when a device is opened, and a machine without them gets
//! [`CudaError::NoDevice`], never a panic.

pub mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod kv_layout;
pub mod layout;

pub use error::CudaError;
#[cfg(feature = "cuda")]
pub use gpu::{
    AttnParams, DevAct, DevKv, DevMatrix, DevVec, GEMM_MIN_TOKENS, Gpu, PagedSeq, decode_chunk,
    decode_splits_bound,
};
pub use kv_layout::KvElem;

/// Whether this build has the GPU code (the `cuda` feature).
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");
