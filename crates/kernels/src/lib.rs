//! Compute kernels: scalar reference implementations (the oracle) and, later,
//! SIMD implementations chosen at run time.

#[cfg(target_arch = "x86_64")]
pub mod attn_amx;
pub mod attn_decode;
pub mod attn_group;
pub mod attn_kv;
pub mod attn_paged;
pub mod attn_paged_q8;
pub mod attn_paged_tiled;
pub mod attn_prefill;
pub mod cpu;
pub mod cuda_probe;
pub mod elementwise;
pub mod gemm;
pub mod hugebuf;
pub mod matmul;
pub mod pool;
pub mod quantdot;
pub mod reference;
pub mod settings;
