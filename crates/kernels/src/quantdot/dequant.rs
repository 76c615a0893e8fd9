//! Test-only f32 dequantization of the supported weight types, written
//! straight from the block layouts (independent of the dot kernels).

use super::scalar::unpack_scales_k4;
use super::{WeightType, f16_to_f32};

fn h(b: &[u8], o: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// Dequantizes one row of whole blocks.
pub fn dequantize(t: WeightType, w: &[u8]) -> Vec<f32> {
    let mut y = Vec::new();
    for b in w.chunks_exact(t.block_bytes()) {
        match t {
            WeightType::Q4_0 => {
                let d = h(b, 0);
                let mut v = [0f32; 32];
                for j in 0..16 {
                    v[j] = ((b[2 + j] & 0xF) as f32 - 8.0) * d;
                    v[j + 16] = ((b[2 + j] >> 4) as f32 - 8.0) * d;
                }
                y.extend_from_slice(&v);
            }
            WeightType::Q4_1 => {
                let (d, m) = (h(b, 0), h(b, 2));
                let mut v = [0f32; 32];
                for j in 0..16 {
                    v[j] = (b[4 + j] & 0xF) as f32 * d + m;
                    v[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
                y.extend_from_slice(&v);
            }
            WeightType::Q5_0 => {
                let d = h(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let mut v = [0f32; 32];
                for j in 0..16 {
                    let x0 = (b[6 + j] & 0xF) as u32 | (((qh >> j) & 1) << 4);
                    let x1 = (b[6 + j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                    v[j] = (x0 as f32 - 16.0) * d;
                    v[j + 16] = (x1 as f32 - 16.0) * d;
                }
                y.extend_from_slice(&v);
            }
            WeightType::Q8_0 => {
                let d = h(b, 0);
                y.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
            WeightType::Q4_K | WeightType::Q5_K => {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let (sc, m) = unpack_scales_k4(&b[4..16]);
                let five = t == WeightType::Q5_K;
                let (qh, qs) = if five {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                for j in 0..4 {
                    for half in 0..2 {
                        let (d1, m1) = (d * sc[2 * j + half] as f32, dmin * m[2 * j + half] as f32);
                        for l in 0..32 {
                            let mut q = (qs[32 * j + l] >> (4 * half)) & 0xF;
                            if five && qh[l] & (1 << (2 * j + half)) != 0 {
                                q += 16;
                            }
                            y.push(d1 * q as f32 - m1);
                        }
                    }
                }
            }
            WeightType::Q6_K => {
                let d = h(b, 208);
                let mut v = [0f32; 256];
                for n in 0..2 {
                    let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let o = 128 * n;
                        v[o + l] = d * sc[is] as i8 as f32 * q1 as f32;
                        v[o + l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                        v[o + l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                        v[o + l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
                    }
                }
                y.extend_from_slice(&v);
            }
        }
    }
    y
}
