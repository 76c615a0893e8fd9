//! Scalar reference dequantization, bit-exact with gguf-py's `gguf.quants.dequantize`.
//!
//! Every product and sum is done in f32 in the same order as gguf-py's numpy code (which
//! also equals ggml's `dequantize_row_*`; the two agree for every type here):
//!
//! | type  | element value                                     |
//! |-------|---------------------------------------------------|
//! | Q4_0  | `d * (q - 8)`                                     |
//! | Q4_1  | `(d * q) + m`                                     |
//! | Q5_0  | `d * (q - 16)`                                    |
//! | Q5_1  | `(d * q) + m`                                     |
//! | Q8_0  | `q * d`                                           |
//! | Q2_K  | `(d * sc) * q - (dmin * m)`                       |
//! | Q3_K  | `(d * (sc - 32)) * (q - 4 * !hbit)`               |
//! | Q4_K  | `(d * sc) * q - (dmin * m)`                       |
//! | Q5_K  | `(d * sc) * q - (dmin * m)`                       |
//! | Q6_K  | `(d * sc) * (q - 32)`                             |
//! | Q8_1  | `q * d` (gguf-py has no Q8_1; ggml semantics)      |
//! | Q8_K  | `d * q`, f32 `d` (gguf-py has no Q8_K; ggml)       |
//!
//! Half scales are widened exactly ([`fp16_to_f32`]); NaN payloads survive into the product
//! as x86 SSE (and numpy) propagate them, quieted. F16 and BF16 rows are widened bit-exactly,
//! signalling NaNs included (numpy does not quiet them; ggml's own F16 path would).

use crate::blocks::{
    Block, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K, BlockQ5_0, BlockQ5_1, BlockQ5_K,
    BlockQ6_K, BlockQ8_0, BlockQ8_1, BlockQ8_K, QK, get_scale_min_k4,
};
use crate::fp::{bf16_to_f32, fp16_to_f32};

/// Runs `f` over each (block, output chunk) pair. Lengths were validated by the caller.
#[inline]
fn for_blocks<B: Block>(src: &[u8], dst: &mut [f32], mut f: impl FnMut(&B, &mut [f32])) {
    for (bytes, out) in src
        .chunks_exact(B::SIZE)
        .zip(dst.chunks_exact_mut(B::ELEMS))
    {
        f(&B::read(bytes), out);
    }
}

/// F32: little-endian copy, bits preserved.
pub(crate) fn f32_row(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// F16: exact widening.
pub(crate) fn f16_row(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *o = fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// BF16: exact widening.
pub(crate) fn bf16_row(src: &[u8], dst: &mut [f32]) {
    for (b, o) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Q4_0 rows. `src`: [n/32] blocks of 18 bytes; `dst`: [n] f32.
pub(crate) fn q4_0_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ4_0>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = d * ((q & 0xf) as i32 - 8) as f32;
            y[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
        }
    });
}

/// Q4_1 rows.
pub(crate) fn q4_1_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ4_1>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        let m = fp16_to_f32(b.m);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = d * f32::from(q & 0xf) + m;
            y[j + QK / 2] = d * f32::from(q >> 4) + m;
        }
    });
}

/// The 5-bit quants `j` and `j + 16` of a Q5_0/Q5_1 block (j in 0..16).
#[inline]
fn q5_pair(qh: u32, q: u8, j: usize) -> (u8, u8) {
    let lo = (q & 0xf) | ((((qh >> j) & 1) as u8) << 4);
    let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    (lo, hi)
}

/// Q5_0 rows.
pub(crate) fn q5_0_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ5_0>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for (j, &q) in b.qs.iter().enumerate() {
            let (lo, hi) = q5_pair(qh, q, j);
            y[j] = d * (i32::from(lo) - 16) as f32;
            y[j + QK / 2] = d * (i32::from(hi) - 16) as f32;
        }
    });
}

/// Q5_1 rows.
pub(crate) fn q5_1_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ5_1>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        let m = fp16_to_f32(b.m);
        let qh = u32::from_le_bytes(b.qh);
        for (j, &q) in b.qs.iter().enumerate() {
            let (lo, hi) = q5_pair(qh, q, j);
            y[j] = d * f32::from(lo) + m;
            y[j + QK / 2] = d * f32::from(hi) + m;
        }
    });
}

/// Q8_0 rows.
pub(crate) fn q8_0_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ8_0>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    });
}

/// Q8_1 rows (the `s` field is ignored, as in ggml).
pub(crate) fn q8_1_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ8_1>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    });
}

/// Q2_K rows. Group g (16 weights) = 32-byte chunk `g / 8`, shift `2 * ((g % 8) / 2)`,
/// bytes `16 * (g % 2)..+16`.
pub(crate) fn q2_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ2_K>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        let dmin = fp16_to_f32(b.dmin);
        for (g, out) in y.chunks_exact_mut(16).enumerate() {
            let sc = b.scales[g];
            let dl = d * f32::from(sc & 0xf);
            let ml = dmin * f32::from(sc >> 4);
            let chunk = &b.qs[32 * (g / 8)..32 * (g / 8) + 32];
            let shift = 2 * ((g % 8) / 2);
            let half = 16 * (g % 2);
            for (l, o) in out.iter_mut().enumerate() {
                let q = (chunk[half + l] >> shift) & 3;
                *o = dl * f32::from(q) - ml;
            }
        }
    });
}

/// Unpacks the sixteen 6-bit Q3_K scales (still biased by +32).
#[inline]
pub(crate) fn q3_k_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = lo | (hi << 4);
    }
    out
}

/// Q3_K rows. Weight `i` of the block: 2 low bits like Q2_K, high bit in `hmask[i % 32]`
/// bit `i / 32`; a *clear* high bit subtracts 4.
pub(crate) fn q3_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ3_K>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        let scales = q3_k_scales(&b.scales);
        for (g, out) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * (i32::from(scales[g]) - 32) as f32;
            let chunk = &b.qs[32 * (g / 8)..32 * (g / 8) + 32];
            let shift = 2 * ((g % 8) / 2);
            let half = 16 * (g % 2);
            for (l, o) in out.iter_mut().enumerate() {
                let i = 16 * g + l;
                let lo = i32::from((chunk[half + l] >> shift) & 3);
                let hbit = (b.hmask[i % 32] >> (i / 32)) & 1;
                let q = lo - if hbit == 0 { 4 } else { 0 };
                *o = dl * q as f32;
            }
        }
    });
}

/// Q4_K rows. 32-byte chunk `c` of `qs` holds group `2c` in its low nibbles and group
/// `2c + 1` in its high nibbles.
pub(crate) fn q4_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ4_K>(src, dst, |b, y| {
        let (d, dmin) = (fp16_to_f32(b.d), fp16_to_f32(b.dmin));
        for (c, (out, qs)) in y
            .chunks_exact_mut(64)
            .zip(b.qs.chunks_exact(32))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
            let (lo, hi) = out.split_at_mut(32);
            for ((o, &q), o2) in lo.iter_mut().zip(qs).zip(hi.iter_mut()) {
                *o = d1 * f32::from(q & 0xf) - m1;
                *o2 = d2 * f32::from(q >> 4) - m2;
            }
        }
    });
}

/// Q5_K rows: Q4_K nibbles plus bit `g` of `qh[l]` as the fifth bit of weight `32g + l`.
pub(crate) fn q5_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ5_K>(src, dst, |b, y| {
        let (d, dmin) = (fp16_to_f32(b.d), fp16_to_f32(b.dmin));
        for (c, (out, qs)) in y
            .chunks_exact_mut(64)
            .zip(b.qs.chunks_exact(32))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, m2) = (d * f32::from(sc2), dmin * f32::from(m2));
            let (s1, s2) = (2 * c, 2 * c + 1);
            let (lo, hi) = out.split_at_mut(32);
            for l in 0..32 {
                let (q, h) = (qs[l], b.qh[l]);
                lo[l] = d1 * f32::from((q & 0xf) | (((h >> s1) & 1) << 4)) - m1;
                hi[l] = d2 * f32::from((q >> 4) | (((h >> s2) & 1) << 4)) - m2;
            }
        }
    });
}

/// Q6_K rows. In each 128-weight half `h`, weight `32k + l` (k in 0..4) takes its low
/// nibble from `ql[64h + l + 32*(k%2)]` (low nibble for k < 2, high for k >= 2) and its two
/// high bits from `qh[32h + l] >> 2k`; its scale is group `8h + 2k + l/16`.
pub(crate) fn q6_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ6_K>(src, dst, |b, y| {
        let d = fp16_to_f32(b.d);
        for (h, out) in y.chunks_exact_mut(128).enumerate() {
            let ql = &b.ql[64 * h..64 * h + 64];
            let qh = &b.qh[32 * h..32 * h + 32];
            for (k, out) in out.chunks_exact_mut(32).enumerate() {
                let ql = &ql[32 * (k % 2)..32 * (k % 2) + 32];
                let shift = if k < 2 { 0 } else { 4 };
                for (half, out) in out.chunks_exact_mut(16).enumerate() {
                    let dl = d * f32::from(b.scales[8 * h + 2 * k + half]);
                    for (i, o) in out.iter_mut().enumerate() {
                        let l = 16 * half + i;
                        let q = ((ql[l] >> shift) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
                        *o = dl * (i32::from(q) - 32) as f32;
                    }
                }
            }
        }
    });
}

/// Q8_K rows.
pub(crate) fn q8_k_row(src: &[u8], dst: &mut [f32]) {
    for_blocks::<BlockQ8_K>(src, dst, |b, y| {
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = b.d * f32::from(q);
        }
    });
}
