//! GGML block quantization formats: scalar reference dequantize/quantize per type,
//! bit-exact with gguf-py (dequant) and llama.cpp (`quantize_row_*_ref`).
//!
//! * [`blocks`]: `#[repr(C)]` block layouts with size asserts and safe byte decoding.
//! * [`dequantize_row`]: bytes of whole blocks -> f32, bit-exact with `gguf.quants.dequantize`.
//! * [`quantize_row`]: f32 -> bytes, bit-identical with llama.cpp's reference quantizers
//!   (no importance matrix), including ggml's f32 -> f16 rounding.
//! * [`fp`]: the scalar conversions (f16/bf16, `nearest_int`) with ggml's exact semantics.
//!
//! * [`recipe`]: llama.cpp's per-tensor type selection for file types (owned separately).
//!
//! Invariant: no function here panics on bad input lengths; they return [`QuantError`].
//!
//! # Oracles and where they disagree
//!
//! * Dequantization follows gguf-py 0.19. ggml's `dequantize_row_*` agree with it bit for bit
//!   on every block type here (checked on 4000 random blocks per type with special scales),
//!   so "bit-exact with gguf-py" also means "bit-exact with ggml" — except for F16 rows:
//!   numpy widens a signalling NaN keeping it signalling (`0x7C01` -> `0x7F802000`), while
//!   ggml's software `GGML_FP16_TO_FP32` quiets it (`0x7FC02000`). We follow gguf-py.
//!   gguf-py has no Q8_1 / Q8_K dequantizer; those follow ggml (`d * q`).
//! * Quantization follows llama.cpp's `ggml-base` as built for `llama-quantize` (no FMA, no
//!   F16C): f32 -> f16 rounds to nearest even and maps every NaN to `0x7E00` (numpy's
//!   `astype(float16)`, used by gguf-py's quantizers, keeps NaN payloads instead). gguf-py's
//!   Q4_0..Q8_0 quantizers are not used as an oracle.
//! * Q8_K: llama.cpp leaves `bsums` unwritten for an all-zero block; we write zeros.
//! * NaN payloads: when two *different* NaNs meet in one f32 operation, the survivor depends
//!   on the compiler's operand order (C and Rust both treat `+`/`*` as commutative), so
//!   neither implementation can promise a payload there. Single NaN inputs and the default
//!   NaNs produced by `Inf - Inf` or `0 * Inf` match (see `tests/quant_golden.rs`).
//!
//! Fixtures: `tools/quant_golden.py` (gguf-py, dequant) and `tools/quant_ref_golden.c`
//! (linked against llama.cpp's `libggml-base`, quantize) regenerate
//! `tests/fixtures/{dequant_golden.bin,quant_golden.txt}`.

pub mod blocks;
mod dequant;
pub mod fp;
mod qkx2_lanes;
mod quant_k;
mod quant_legacy;
pub mod recipe;

pub use blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0, BlockQ8_1, BlockQ8_K, QK_K, cast_blocks, read_blocks,
};
pub use damascus_gguf::GgmlType;

/// Errors of the quantization routines.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    /// The type has no (de)quantizer here.
    #[error("{op} is not supported for tensor type {dtype}")]
    Unsupported {
        /// `"dequantize"` or `"quantize"`.
        op: &'static str,
        /// The offending type.
        dtype: GgmlType,
    },
    /// The element count is not a multiple of the type's block size.
    #[error("{n_elems} elements is not a multiple of the {dtype} block size {block_size}")]
    NotBlockMultiple {
        /// The type.
        dtype: GgmlType,
        /// Element count requested.
        n_elems: usize,
        /// Elements per block of `dtype`.
        block_size: usize,
    },
    /// The source buffer has the wrong length.
    #[error("source has {found} bytes/elements, expected {expected}")]
    SrcLen {
        /// Expected length.
        expected: usize,
        /// Actual length.
        found: usize,
    },
    /// The destination buffer has the wrong length.
    #[error("destination has {found} bytes/elements, expected {expected}")]
    DstLen {
        /// Expected length.
        expected: usize,
        /// Actual length.
        found: usize,
    },
    /// A zero-copy block view was requested on a misaligned buffer.
    #[error("buffer at {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// Required alignment.
        align: usize,
        /// Buffer address.
        addr: usize,
    },
}

/// The types [`dequantize_row`] and [`quantize_row`] handle.
pub const SUPPORTED: [GgmlType; 15] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    ]
};

/// Whether [`dequantize_row`] supports `dtype`.
pub fn can_dequantize(dtype: GgmlType) -> bool {
    SUPPORTED.contains(&dtype)
}

/// Whether [`quantize_row`] supports `dtype`.
pub fn can_quantize(dtype: GgmlType) -> bool {
    SUPPORTED.contains(&dtype)
}

/// Bytes for `n_elems` elements of `dtype`, checking the block multiple.
fn row_bytes(dtype: GgmlType, n_elems: usize) -> Result<usize, QuantError> {
    let bs = dtype.block_size();
    if bs == 0 || !n_elems.is_multiple_of(bs) {
        return Err(QuantError::NotBlockMultiple {
            dtype,
            n_elems,
            block_size: bs,
        });
    }
    Ok(n_elems / bs * dtype.type_size())
}

/// Dequantizes one row: `src` holds exactly `row_bytes(dst.len())` bytes of `dtype` blocks,
/// `dst` receives `dst.len()` f32 values (a multiple of the block size).
///
/// Bit-exact with gguf-py's `gguf.quants.dequantize` (see the crate docs for the NaN caveats).
pub fn dequantize_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !can_dequantize(dtype) {
        return Err(QuantError::Unsupported {
            op: "dequantize",
            dtype,
        });
    }
    let expected = row_bytes(dtype, dst.len())?;
    if src.len() != expected {
        return Err(QuantError::SrcLen {
            expected,
            found: src.len(),
        });
    }
    use GgmlType::*;
    match dtype {
        F32 => dequant::f32_row(src, dst),
        F16 => dequant::f16_row(src, dst),
        BF16 => dequant::bf16_row(src, dst),
        Q4_0 => dequant::q4_0_row(src, dst),
        Q4_1 => dequant::q4_1_row(src, dst),
        Q5_0 => dequant::q5_0_row(src, dst),
        Q5_1 => dequant::q5_1_row(src, dst),
        Q8_0 => dequant::q8_0_row(src, dst),
        Q8_1 => dequant::q8_1_row(src, dst),
        Q2_K => dequant::q2_k_row(src, dst),
        Q3_K => dequant::q3_k_row(src, dst),
        Q4_K => dequant::q4_k_row(src, dst),
        Q5_K => dequant::q5_k_row(src, dst),
        Q6_K => dequant::q6_k_row(src, dst),
        Q8_K => dequant::q8_k_row(src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                op: "dequantize",
                dtype,
            });
        }
    }
    Ok(())
}

/// Quantizes one row: `src` holds a multiple of the block size of f32 values, `dst` exactly
/// the matching number of bytes. Bit-identical with llama.cpp's `quantize_row_*_ref`
/// (and `ggml_fp32_to_fp16_row` / `ggml_fp32_to_bf16_row_ref` for F16 / BF16).
pub fn quantize_row(dtype: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !can_quantize(dtype) {
        return Err(QuantError::Unsupported {
            op: "quantize",
            dtype,
        });
    }
    let expected = row_bytes(dtype, src.len())?;
    if dst.len() != expected {
        return Err(QuantError::DstLen {
            expected,
            found: dst.len(),
        });
    }
    use GgmlType::*;
    match dtype {
        F32 => {
            for (o, v) in dst.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        F16 => {
            for (o, v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&fp::f32_to_fp16(*v).to_le_bytes());
            }
        }
        BF16 => {
            for (o, v) in dst.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&fp::f32_to_bf16(*v).to_le_bytes());
            }
        }
        Q4_0 => quant_legacy::q4_0_row(src, dst),
        Q4_1 => quant_legacy::q4_1_row(src, dst),
        Q5_0 => quant_legacy::q5_0_row(src, dst),
        Q5_1 => quant_legacy::q5_1_row(src, dst),
        Q8_0 => quant_legacy::q8_0_row(src, dst),
        Q8_1 => quant_legacy::q8_1_row(src, dst),
        Q2_K => quant_k::q2_k_row(src, dst),
        Q3_K => quant_k::q3_k_row(src, dst),
        Q4_K => quant_k::q4_k_row(src, dst),
        Q5_K => quant_k::q5_k_row(src, dst),
        Q6_K => quant_k::q6_k_row(src, dst),
        Q8_K => quant_k::q8_k_row(src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                op: "quantize",
                dtype,
            });
        }
    }
    Ok(())
}
