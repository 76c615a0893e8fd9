//! Reference quantizers for the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1),
//! bit-identical with llama.cpp's `quantize_row_*_ref`.
//!
//! Float semantics reproduced: all arithmetic in f32 in ggml's order; `d ? 1/d : 0` (so a
//! NaN scale stays NaN); C's float -> 8-bit integer casts as x86-64 compiles them
//! (`cvttss2si`, then the low byte, see [`c_trunc_i32`]); ggml's `MIN`/`MAX` macros (which
//! are not NaN-symmetric); f16 scales rounded by [`f32_to_fp16`].

use crate::blocks::{Block, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK};
use crate::fp::{c_trunc_i32, f32_to_fp16};

/// Runs `f` over each (input chunk, output block bytes) pair.
#[inline]
fn for_blocks<B: Block>(src: &[f32], dst: &mut [u8], mut f: impl FnMut(&[f32]) -> B) {
    for (x, out) in src
        .chunks_exact(B::ELEMS)
        .zip(dst.chunks_exact_mut(B::SIZE))
    {
        f(x).write(out);
    }
}

/// `(int8_t)f` on x86-64: truncate to i32 (indefinite on overflow/NaN), keep the low byte.
#[inline]
fn c_i8(f: f32) -> i32 {
    i32::from(c_trunc_i32(f) as i8)
}

/// ggml's `d ? 1.0f/d : 0.0f`.
#[inline]
fn inv(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// The value with the largest magnitude (first one wins ties), as Q4_0/Q5_0 search it.
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Minimum and maximum as Q4_1/Q5_1 search them (NaNs never win a comparison).
#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Q4_0: `d = absmax_signed / -8`, `q = min(15, (i8)(x/d + 8.5))`.
pub(crate) fn q4_0_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let d = signed_absmax(x) / -8.0;
        let id = inv(d);
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let xi0 = 15.min(c_i8(x[j] * id + 8.5)) as u8;
            let xi1 = 15.min(c_i8(x[j + QK / 2] * id + 8.5)) as u8;
            *q = xi0 | (xi1 << 4);
        }
        BlockQ4_0 {
            d: f32_to_fp16(d),
            qs,
        }
    });
}

/// Q4_1: `d = (max - min) / 15`, `q = min(15, (i8)((x - min)/d + 0.5))`.
pub(crate) fn q4_1_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inv(d);
        let mut qs = [0u8; QK / 2];
        for (j, q) in qs.iter_mut().enumerate() {
            let xi0 = 15.min(c_i8((x[j] - min) * id + 0.5)) as u8;
            let xi1 = 15.min(c_i8((x[j + QK / 2] - min) * id + 0.5)) as u8;
            *q = xi0 | (xi1 << 4);
        }
        BlockQ4_1 {
            d: f32_to_fp16(d),
            m: f32_to_fp16(min),
            qs,
        }
    });
}

/// Packs 32 five-bit quants into Q5 nibbles + high-bit word.
#[inline]
fn pack_q5(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (a, b) = (q[j], q[j + QK / 2]);
        qs[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        qh |= u32::from((a & 0x10) >> 4) << j;
        qh |= u32::from((b & 0x10) >> 4) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

/// Q5_0: `d = absmax_signed / -16`, `q = min(31, (i8)(x/d + 16.5))`.
pub(crate) fn q5_0_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let d = signed_absmax(x) / -16.0;
        let id = inv(d);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = 31.min(c_i8(v * id + 16.5)) as u8;
        }
        let (qh, qs) = pack_q5(&q);
        BlockQ5_0 {
            d: f32_to_fp16(d),
            qh,
            qs,
        }
    });
}

/// Q5_1: `d = (max - min) / 31`, `q = (u8)((x - min)/d + 0.5)` (no clamp, as in ggml).
pub(crate) fn q5_1_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inv(d);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = c_trunc_i32((v - min) * id + 0.5) as u8;
        }
        let (qh, qs) = pack_q5(&q);
        BlockQ5_1 {
            d: f32_to_fp16(d),
            m: f32_to_fp16(min),
            qh,
            qs,
        }
    });
}

/// Absolute maximum with ggml's `MAX(a, b) = a > b ? a : b` (a NaN is kept only if last).
#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(
        0.0f32,
        |amax, v| if amax > v.abs() { amax } else { v.abs() },
    )
}

/// Q8_0 / Q8_1 quants: `d = absmax / 127`, `q = (i8)roundf(x/d)`.
#[inline]
fn q8_quants(x: &[f32]) -> (f32, [i8; QK]) {
    let d = absmax(x) / 127.0;
    let id = inv(d);
    let mut qs = [0i8; QK];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = c_trunc_i32((v * id).round()) as i8;
    }
    (d, qs)
}

/// Q8_0.
pub(crate) fn q8_0_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let (d, qs) = q8_quants(x);
        BlockQ8_0 {
            d: f32_to_fp16(d),
            qs,
        }
    });
}

/// Q8_1: Q8_0 plus `s = fp16(sum(q) * d)`.
pub(crate) fn q8_1_row(src: &[f32], dst: &mut [u8]) {
    for_blocks(src, dst, |x| {
        let (d, qs) = q8_quants(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 {
            d: f32_to_fp16(d),
            s: f32_to_fp16(sum as f32 * d),
            qs,
        }
    });
}
