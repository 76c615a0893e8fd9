//! Quantized dot products: weight rows in the ggml block layouts times
//! activations quantized once per matmul (Q8_K for K-quants, Q8_0/Q8_1 for the
//! legacy 32-element types).
//!
//! Every kernel exists as a scalar integer reference ([`scalar`], the oracle)
//! and as SIMD variants for AVX2 (`vpmaddubsw`), AVX-512BW and AVX-512 VNNI
//! (`vpdpbusd` / `vpdpwssd`). The variant is picked once at run time
//! ([`kernels`]), honouring `DAMASCUS_ISA=scalar|avx2|avx512|vnni`.
//!
//! Weight rows are plain `&[u8]` slices holding whole ggml blocks; activations
//! are slices of the `#[repr(C)]` blocks defined here.

pub mod act;
pub mod dispatch;
pub mod gemv;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
// The AVX-512 intrinsics are stable since Rust 1.89.
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
mod avx512;

#[cfg(test)]
mod dequant;
#[cfg(test)]
mod tests;

pub use act::{
    ActBuf, Acts, BlockQ8_0, BlockQ8_1, BlockQ8K, quantize_q8_0, quantize_q8_0_ref, quantize_q8_1,
    quantize_q8_1_ref, quantize_q8_k, quantize_q8_k_ref,
};
pub use dispatch::{DotKernels, Isa, kernels, kernels_for};
pub use gemv::{gemv, gemv_rows, gemv_with};

/// Elements per K-quant super-block.
pub const QK_K: usize = 256;
/// Elements per legacy block (Q4_0, Q4_1, Q5_0, Q8_0, Q8_1).
pub const QK: usize = 32;

/// Weight types that have dot-product kernels.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    /// 4-bit, one f16 scale per 32 (value = (q - 8) * d).
    Q4_0,
    /// 4-bit, f16 scale and min per 32 (value = q * d + m).
    Q4_1,
    /// 5-bit, one f16 scale per 32 (value = (q - 16) * d).
    Q5_0,
    /// 8-bit, one f16 scale per 32.
    Q8_0,
    /// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
    Q4_K,
    /// 5-bit K-quant: like Q4_K plus one high bit per element.
    Q5_K,
    /// 6-bit K-quant: 16 sub-blocks of 16 with i8 scales.
    Q6_K,
}

/// Activation block formats a weight type is paired with.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActType {
    /// [`BlockQ8_0`]: f16 d + 32 × i8.
    Q8_0,
    /// [`BlockQ8_1`]: f16 d, f16 s = d·Σq, 32 × i8.
    Q8_1,
    /// [`BlockQ8K`]: f32 d, 256 × i8, 16 × i16 block sums.
    Q8_K,
}

impl WeightType {
    /// All supported weight types.
    pub const ALL: [WeightType; 7] = [
        WeightType::Q4_0,
        WeightType::Q4_1,
        WeightType::Q5_0,
        WeightType::Q8_0,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
    ];

    /// Maps a ggml type id (as stored in GGUF) to a supported weight type.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            2 => WeightType::Q4_0,
            3 => WeightType::Q4_1,
            6 => WeightType::Q5_0,
            8 => WeightType::Q8_0,
            12 => WeightType::Q4_K,
            13 => WeightType::Q5_K,
            14 => WeightType::Q6_K,
            _ => return None,
        })
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            WeightType::Q4_0 => 2,
            WeightType::Q4_1 => 3,
            WeightType::Q5_0 => 6,
            WeightType::Q8_0 => 8,
            WeightType::Q4_K => 12,
            WeightType::Q5_K => 13,
            WeightType::Q6_K => 14,
        }
    }

    /// Name as ggml spells it ("Q4_K").
    pub fn name(self) -> &'static str {
        match self {
            WeightType::Q4_0 => "Q4_0",
            WeightType::Q4_1 => "Q4_1",
            WeightType::Q5_0 => "Q5_0",
            WeightType::Q8_0 => "Q8_0",
            WeightType::Q4_K => "Q4_K",
            WeightType::Q5_K => "Q5_K",
            WeightType::Q6_K => "Q6_K",
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => QK_K,
            _ => QK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::Q4_0 => 18,
            WeightType::Q4_1 => 20,
            WeightType::Q5_0 => 22,
            WeightType::Q8_0 => 34,
            WeightType::Q4_K => 144,
            WeightType::Q5_K => 176,
            WeightType::Q6_K => 210,
        }
    }

    /// Bytes of one row of `k` elements, `None` if `k` is not a multiple of
    /// the block size.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if !k.is_multiple_of(self.block_elems()) {
            return None;
        }
        (k / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Activation format this weight type is multiplied with.
    pub fn act_type(self) -> ActType {
        match self {
            WeightType::Q4_1 => ActType::Q8_1,
            WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => ActType::Q8_0,
            WeightType::Q4_K | WeightType::Q5_K | WeightType::Q6_K => ActType::Q8_K,
        }
    }
}

/// Errors from the quantized dot-product, GEMV and decode-attention entry points.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// `k` is not a multiple of the block size of `wtype`.
    #[error("{wtype:?}: row length {k} is not a multiple of the block size {block}")]
    BadRowLength {
        /// Weight type.
        wtype: WeightType,
        /// Row length in elements.
        k: usize,
        /// Block size in elements.
        block: usize,
    },
    /// A buffer has the wrong length.
    #[error("{what}: expected {expected} {unit}, found {found}")]
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        found: usize,
        /// Unit of the lengths ("bytes", "blocks", "elements").
        unit: &'static str,
    },
    /// Inconsistent attention geometry.
    #[error("attention shape: {0}")]
    BadShape(String),
    /// A buffer could not be mapped (out of memory or address space, or a size that
    /// overflows).
    #[error("cannot map a buffer of {bytes} bytes: {why}")]
    Map {
        /// Requested size (saturated where it overflows).
        bytes: usize,
        /// What the system said.
        why: String,
    },
    /// The activations are in a format that does not pair with the weights.
    #[error("{wtype:?} weights need {expected:?} activations, found {found:?}")]
    WrongActType {
        /// Weight type.
        wtype: WeightType,
        /// Activation type it needs.
        expected: ActType,
        /// Activation type given.
        found: ActType,
    },
}

/// Default software-prefetch distance (bytes ahead in the weight stream).
/// Measured on the 16-core Xeon (AVX-512 VNNI) device host, Q4_K GEMV
/// 3072×8192 streaming from DRAM, 1 thread: 7.4 GB/s without prefetch,
/// 12.2 GB/s at 2048, 13.4 GB/s at 4096 (single-core read roofline 15.3); at
/// 2 threads 2048 and 4096 tie (21.1 / 21.0 GB/s). End to end on the 2-core
/// AMX dev VM (synthetic Llama-3.2-3B Q4_K_M, tg32, `-t 2`): 8.1 tok/s at 512,
/// 8.7 at 1024, 9.1 at 1536–2048, 8.7 at 3072, 8.15 at 4096 — so 2048.
pub const DEFAULT_PREFETCH: usize = 2048;

/// Software-prefetch distance in bytes used by the SIMD kernels while they
/// stream weights: [`crate::settings::KernelSettings::prefetch`] as installed (0 = off), or
/// [`DEFAULT_PREFETCH`].
pub fn prefetch_distance() -> usize {
    static D: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *D.get_or_init(|| crate::settings::installed_prefetch().unwrap_or(DEFAULT_PREFETCH))
}

/// f16 bits to f32 (portable; the SIMD kernels use F16C).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to f16 bits, round to nearest even (ggml's `GGML_FP32_TO_FP16`).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
