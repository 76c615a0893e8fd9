//! Inputs shared by the kernel benchmarks (`gemm`, `gemv`, `kernels`): a fixed pseudo-random
//! weight matrix quantized by the real quantizer, activations, and raw random blocks with
//! small finite scales for the dot products. Each bench uses a subset.
#![allow(dead_code)]

use damascus_kernels::quantdot::WeightType;
use damascus_quant::{GgmlType, quantize_row};

/// `rows × k` weights of `dt` (`[rows, row_bytes]` u8), quantized from a fixed pattern in
/// `[-1, 1)`.
pub fn quantized_weights(dt: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let rb = k / dt.block_size() * dt.type_size();
    let src: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut bytes = vec![0u8; rows * rb];
    for r in 0..rows {
        quantize_row(
            dt,
            &src[r * k..(r + 1) * k],
            &mut bytes[r * rb..(r + 1) * rb],
        )
        .expect("quantize");
    }
    bytes
}

/// `n` activations from a fixed pattern in `[-1, 1]`.
pub fn acts(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 104_729 % 997) as f32 / 498.0) - 1.0)
        .collect()
}

/// Sets every block's f16 scale fields of `w` (blocks of `t`) to 0x2000 (≈ 0.0078), so random
/// bytes make finite, small dot products.
pub fn tame_scales(t: WeightType, w: &mut [u8]) {
    let scale_offs: &[usize] = match t {
        WeightType::Q6_K => &[208],
        WeightType::Q4_1 | WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
        _ => &[0],
    };
    for b in w.chunks_exact_mut(t.block_bytes()) {
        for &off in scale_offs {
            b[off..off + 2].copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
}
