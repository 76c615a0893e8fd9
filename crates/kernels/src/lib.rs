//! Compute kernels: scalar reference implementations (the oracle) and, later,
//! SIMD implementations chosen at run time.

pub mod attn_decode;
pub mod attn_prefill;
pub mod cpu;
pub mod cuda_probe;
pub mod elementwise;
pub mod gemm;
pub mod pool;
pub mod quantdot;
pub mod reference;
