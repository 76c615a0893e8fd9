//! Device weight layouts: how a GGUF matrix is laid out in GPU memory for the kernels in
//! `kernels/damascus.cu`. Pure host code (no CUDA needed), so CI tests it everywhere.
//!
//! Q4_K (144-byte blocks) and Q4_1 (20-byte blocks) are uploaded as they are: their blocks are
//! 16- and 4-byte aligned, which the kernels' vector loads need. Q8_0 (34 B), Q5_0 (22 B) and
//! Q6_K (210 B) blocks are not, so they are split into aligned *planes* (quants, then scales),
//! every plane indexed by `block = row * blocks_per_row + b`. Every other dequantizable type is
//! dequantized on the host to f16 (`Format::F16`), which the kernels read as is.

use damascus_gguf::GgmlType;
use damascus_quant::fp::f32_to_fp16;

use crate::error::CudaError;

/// A device weight format; the discriminant is the kernel's `FMT_*` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Native Q4_K blocks.
    Q4K = 0,
    /// Native Q4_1 blocks.
    Q41 = 1,
    /// Q8_0 planes: `qs[32]` per block, then `d` (f16) per block.
    Q80 = 2,
    /// Q5_0 planes: `qs[16]`, then `qh` (u32), then `d` (f16).
    Q50 = 3,
    /// Q6_K planes: `ql[128] qh[64]`, then `scales[16]`, then `d` (f16).
    Q6K = 4,
    /// Row-major f16 (any other type, dequantized on the host).
    F16 = 5,
}

impl Format {
    /// The device format a GGUF type is uploaded in, if it can be.
    pub fn for_type(dtype: GgmlType) -> Option<Format> {
        Some(match dtype {
            GgmlType::Q4_K => Format::Q4K,
            GgmlType::Q4_1 => Format::Q41,
            GgmlType::Q8_0 => Format::Q80,
            GgmlType::Q5_0 => Format::Q50,
            GgmlType::Q6_K => Format::Q6K,
            t if damascus_quant::can_dequantize(t) => Format::F16,
            _ => return None,
        })
    }
}

/// A matrix in its device layout, still on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The layout.
    pub format: Format,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// All planes, back to back.
    pub bytes: Vec<u8>,
    /// Byte offset of plane 1 (0 when the format has one plane).
    pub off1: usize,
    /// Byte offset of plane 2 (0 when the format has fewer).
    pub off2: usize,
}

/// Rounds `n` up to a multiple of 16 (every plane starts 16-byte aligned).
fn align16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

fn bad(what: String) -> CudaError {
    CudaError::Shape(what)
}

/// Splits `n_blocks` blocks of `block` bytes into planes: `fields` lists each plane's
/// `(offset in the block, bytes)`; returns the bytes and the plane offsets.
fn split_planes(src: &[u8], block: usize, fields: &[(usize, usize)]) -> (Vec<u8>, Vec<usize>) {
    let n_blocks = src.len() / block;
    let mut offs = Vec::with_capacity(fields.len());
    let mut total = 0;
    for &(_, len) in fields {
        offs.push(total);
        total = align16(total + n_blocks * len);
    }
    let mut out = vec![0u8; total];
    for (b, blk) in src.chunks_exact(block).enumerate() {
        for (&(at, len), &off) in fields.iter().zip(&offs) {
            out[off + b * len..off + (b + 1) * len].copy_from_slice(&blk[at..at + len]);
        }
    }
    (out, offs)
}

/// Lays out `rows` rows of `cols` elements of `dtype` (`src`: the GGUF bytes, rows back to
/// back) for the device.
pub fn pack(dtype: GgmlType, src: &[u8], rows: usize, cols: usize) -> Result<Packed, CudaError> {
    let format = Format::for_type(dtype).ok_or_else(|| {
        bad(format!(
            "{} weights are not supported on CUDA",
            dtype.name()
        ))
    })?;
    let row_bytes = dtype
        .row_bytes(cols as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            bad(format!(
                "a {} row of {cols} elements is not a whole number of blocks",
                dtype.name()
            ))
        })?;
    if rows.checked_mul(row_bytes) != Some(src.len()) {
        return Err(bad(format!(
            "{} matrix [{rows}, {cols}] needs {} bytes, got {}",
            dtype.name(),
            rows.saturating_mul(row_bytes),
            src.len()
        )));
    }
    if !cols.is_multiple_of(32) {
        return Err(bad(format!(
            "CUDA kernels need a multiple of 32 columns, got {cols}"
        )));
    }
    let planes = |block, fields: &[(usize, usize)]| split_planes(src, block, fields);
    let (bytes, offs) = match format {
        Format::Q4K | Format::Q41 => (src.to_vec(), vec![0]),
        // d: f16 at 0, qs[32] at 2.
        Format::Q80 => planes(34, &[(2, 32), (0, 2)]),
        // d: f16 at 0, qh[4] at 2, qs[16] at 6.
        Format::Q50 => planes(22, &[(6, 16), (2, 4), (0, 2)]),
        // ql[128] at 0, qh[64] at 128, scales[16] at 192, d at 208.
        Format::Q6K => planes(210, &[(0, 192), (192, 16), (208, 2)]),
        Format::F16 => {
            let mut row = vec![0f32; cols];
            let mut out = Vec::with_capacity(rows * cols * 2);
            for r in src.chunks_exact(row_bytes) {
                damascus_quant::dequantize_row(dtype, r, &mut row)
                    .map_err(|e| bad(e.to_string()))?;
                for &v in &row {
                    out.extend_from_slice(&f32_to_fp16(v).to_le_bytes());
                }
            }
            (out, vec![0])
        }
    };
    Ok(Packed {
        format,
        rows,
        cols,
        bytes,
        off1: offs.get(1).copied().unwrap_or(0),
        off2: offs.get(2).copied().unwrap_or(0),
    })
}

/// Host twin of the device `deq32`: dequantizes row `row` of a packed matrix (tests compare it
/// with `damascus_quant::dequantize_row` on the original bytes, and the GPU with it).
pub fn dequant_row(p: &Packed, row: usize) -> Vec<f32> {
    use damascus_quant::fp::fp16_to_f32;
    let cols = p.cols;
    let b = &p.bytes;
    let h = |at: usize| fp16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
    let mut o = vec![0f32; cols];
    match p.format {
        Format::Q4K | Format::Q41 => {
            let dtype = if p.format == Format::Q4K {
                GgmlType::Q4_K
            } else {
                GgmlType::Q4_1
            };
            let rb = dtype.row_bytes(cols as u64).unwrap_or(0) as usize;
            let _ = damascus_quant::dequantize_row(dtype, &b[row * rb..(row + 1) * rb], &mut o);
        }
        Format::Q80 => {
            let nb = cols / 32;
            for g in 0..nb {
                let blk = row * nb + g;
                let d = h(p.off1 + 2 * blk);
                for j in 0..32 {
                    o[32 * g + j] = d * f32::from(b[32 * blk + j] as i8);
                }
            }
        }
        Format::Q50 => {
            let nb = cols / 32;
            for g in 0..nb {
                let blk = row * nb + g;
                let qh = u32::from_le_bytes(
                    b[p.off1 + 4 * blk..p.off1 + 4 * blk + 4]
                        .try_into()
                        .unwrap_or([0; 4]),
                );
                let d = h(p.off2 + 2 * blk);
                for j in 0..16 {
                    let q = b[16 * blk + j];
                    let lo = (q & 0xf) | ((((qh >> j) & 1) as u8) << 4);
                    let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                    o[32 * g + j] = d * (i32::from(lo) - 16) as f32;
                    o[32 * g + j + 16] = d * (i32::from(hi) - 16) as f32;
                }
            }
        }
        Format::Q6K => {
            let nb = cols / 256;
            for sb in 0..nb {
                let blk = row * nb + sb;
                let qlh = &b[192 * blk..192 * blk + 192];
                let scs = &b[p.off1 + 16 * blk..p.off1 + 16 * blk + 16];
                let d = h(p.off2 + 2 * blk);
                for s in 0..8 {
                    let (n, k) = (s / 4, s % 4);
                    let ql = &qlh[64 * n + 32 * (k % 2)..];
                    let qh = &qlh[128 + 32 * n..];
                    let sh = if k < 2 { 0 } else { 4 };
                    for l in 0..32 {
                        let q = ((ql[l] >> sh) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
                        let sc = f32::from(scs[8 * n + 2 * k + l / 16] as i8);
                        o[256 * sb + 32 * s + l] = d * sc * (i32::from(q) - 32) as f32;
                    }
                }
            }
        }
        Format::F16 => {
            for (j, v) in o.iter_mut().enumerate() {
                *v = h(2 * (row * cols + j));
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random bytes (an xorshift).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    /// Random but valid blocks: quantize random floats with our own quantizer.
    fn matrix(dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let raw = bytes(rows * cols, 7 + rows as u64);
        let x: Vec<f32> = raw.iter().map(|&b| (f32::from(b) - 127.5) / 50.0).collect();
        let rb = dtype.row_bytes(cols as u64).unwrap() as usize;
        let mut out = vec![0u8; rows * rb];
        for (r, dst) in out.chunks_exact_mut(rb).enumerate() {
            damascus_quant::quantize_row(dtype, &x[r * cols..(r + 1) * cols], dst).unwrap();
        }
        out
    }

    #[test]
    fn packed_rows_dequantize_like_the_file() {
        for dtype in [
            GgmlType::Q4_K,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q6_K,
            GgmlType::Q5_K,
            GgmlType::F16,
        ] {
            for (rows, cols) in [(1, 256), (3, 512), (7, 768)] {
                let src = matrix(dtype, rows, cols);
                let p = pack(dtype, &src, rows, cols).unwrap();
                assert_eq!(p.off1 % 16, 0);
                assert_eq!(p.off2 % 16, 0);
                let rb = src.len() / rows;
                for r in 0..rows {
                    let mut want = vec![0f32; cols];
                    damascus_quant::dequantize_row(dtype, &src[r * rb..(r + 1) * rb], &mut want)
                        .unwrap();
                    let got = dequant_row(&p, r);
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        // F16 rounds; every other format is exact.
                        let tol = if p.format == Format::F16 {
                            w.abs() * 1e-3
                        } else {
                            0.0
                        };
                        assert!(
                            (g - w).abs() <= tol,
                            "{dtype:?} [{rows},{cols}] row {r} col {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let src = matrix(GgmlType::Q4_K, 2, 256);
        assert!(pack(GgmlType::Q4_K, &src[..100], 2, 256).is_err());
        assert!(pack(GgmlType::Q4_K, &src, 3, 256).is_err());
        assert!(pack(GgmlType::Q4_K, &src, 2, 200).is_err());
        assert!(pack(GgmlType::F32, &[0u8; 4 * 33], 1, 33).is_err());
    }
}
