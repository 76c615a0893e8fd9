//! Scalar integer reference dot products (the oracle for the SIMD variants).
//!
//! Each function takes one weight row (`w`: whole ggml blocks, `[nb * block_bytes]`
//! u8) and the matching quantized activations (`a`: `[nb]` blocks) and returns
//! the f32 dot product. Integer sums per (sub-)block are exact; only the final
//! scaling is floating point. Extra bytes/blocks beyond the shorter operand are
//! ignored.

use super::{BlockQ8_0, BlockQ8_1, BlockQ8K, f16_to_f32};

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Unpacks the 12-byte K-quant scale field into 8 six-bit scales and 8 mins
/// (ggml's `get_scale_min_k4` for j = 0..8).
#[inline(always)]
pub fn unpack_scales_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    (sc, m)
}

/// Q4_K row (144 bytes per 256) · Q8_K.
pub fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(144).zip(a) {
        let d = f16_at(b, 0) * y.d;
        let dmin = f16_at(b, 2) * y.d;
        let (sc, m) = unpack_scales_k4(&b[4..16]);
        let qs = &b[16..144];
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                lo += (q & 0xF) as i32 * y.qs[64 * j + l] as i32;
                hi += (q >> 4) as i32 * y.qs[64 * j + 32 + l] as i32;
            }
            sumi += sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi;
        }
        let summ: i32 = m
            .iter()
            .zip(y.bsums.chunks_exact(2))
            .map(|(&m, s)| m as i32 * (s[0] as i32 + s[1] as i32))
            .sum();
        acc += d * sumi as f32 - dmin * summ as f32;
    }
    acc
}

/// Q5_K row (176 bytes per 256) · Q8_K.
pub fn dot_q5_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(176).zip(a) {
        let d = f16_at(b, 0) * y.d;
        let dmin = f16_at(b, 2) * y.d;
        let (sc, m) = unpack_scales_k4(&b[4..16]);
        let qh = &b[16..48];
        let qs = &b[48..176];
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                let h = qh[l] >> (2 * j);
                let q0 = (q & 0xF) | ((h & 1) << 4);
                let q1 = (q >> 4) | (((h >> 1) & 1) << 4);
                lo += q0 as i32 * y.qs[64 * j + l] as i32;
                hi += q1 as i32 * y.qs[64 * j + 32 + l] as i32;
            }
            sumi += sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi;
        }
        let summ: i32 = m
            .iter()
            .zip(y.bsums.chunks_exact(2))
            .map(|(&m, s)| m as i32 * (s[0] as i32 + s[1] as i32))
            .sum();
        acc += d * sumi as f32 - dmin * summ as f32;
    }
    acc
}

/// Q6_K row (210 bytes per 256) · Q8_K.
pub fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(210).zip(a) {
        let ql = &b[0..128];
        let qh = &b[128..192];
        let sc = &b[192..208];
        let d = f16_at(b, 208) * y.d;
        let mut sumi = 0i32;
        for n in 0..2 {
            let ql = &ql[64 * n..];
            let qh = &qh[32 * n..];
            let ys = &y.qs[128 * n..];
            // Per 16-element sub-block sums, 8 sub-blocks in this half.
            let mut s = [0i32; 8];
            for l in 0..32 {
                let is = l / 16;
                let h = qh[l];
                let q1 = ((ql[l] & 0xF) | ((h & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
                s[is] += q1 * ys[l] as i32;
                s[is + 2] += q2 * ys[l + 32] as i32;
                s[is + 4] += q3 * ys[l + 64] as i32;
                s[is + 6] += q4 * ys[l + 96] as i32;
            }
            for (k, sk) in s.iter().enumerate() {
                sumi += sc[8 * n + k] as i8 as i32 * sk;
            }
        }
        acc += d * sumi as f32;
    }
    acc
}

/// Q8_0 row (34 bytes per 32) · Q8_0.
pub fn dot_q8_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(34).zip(a) {
        let d = f16_at(b, 0) * f16_to_f32(y.d);
        let s: i32 = b[2..34]
            .iter()
            .zip(&y.qs)
            .map(|(&q, &v)| q as i8 as i32 * v as i32)
            .sum();
        acc += d * s as f32;
    }
    acc
}

/// Q4_0 row (18 bytes per 32) · Q8_0.
pub fn dot_q4_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(18).zip(a) {
        let d = f16_at(b, 0) * f16_to_f32(y.d);
        let mut s = 0i32;
        for j in 0..16 {
            let q = b[2 + j];
            s += ((q & 0xF) as i32 - 8) * y.qs[j] as i32;
            s += ((q >> 4) as i32 - 8) * y.qs[j + 16] as i32;
        }
        acc += d * s as f32;
    }
    acc
}

/// Q4_1 row (20 bytes per 32) · Q8_1.
pub fn dot_q4_1(w: &[u8], a: &[BlockQ8_1]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(20).zip(a) {
        let d = f16_at(b, 0) * f16_to_f32(y.d);
        let m = f16_at(b, 2) * f16_to_f32(y.s);
        let mut s = 0i32;
        for j in 0..16 {
            let q = b[4 + j];
            s += (q & 0xF) as i32 * y.qs[j] as i32;
            s += (q >> 4) as i32 * y.qs[j + 16] as i32;
        }
        acc += d * s as f32 + m;
    }
    acc
}

/// Q5_0 row (22 bytes per 32) · Q8_0.
pub fn dot_q5_0(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(22).zip(a) {
        let d = f16_at(b, 0) * f16_to_f32(y.d);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let mut s = 0i32;
        for j in 0..16 {
            let q = b[6 + j];
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            s += (((q & 0xF) as u32 | h0) as i32 - 16) * y.qs[j] as i32;
            s += (((q >> 4) as u32 | h1) as i32 - 16) * y.qs[j + 16] as i32;
        }
        acc += d * s as f32;
    }
    acc
}
