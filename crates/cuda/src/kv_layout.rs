//! The device KV cache's element types and layout: pure host code (no CUDA needed), so CI
//! tests it everywhere; the kernels' `kv_head_bytes` / `kv_load` are its device twins.
//!
//! A layer of the cache is `n_kv` head regions, each `n_ctx` rows (positions, or the paged
//! pool's slots) of `head_dim` values:
//! * f16: `[n_ctx][head_dim]` f16, `2 * n_ctx * head_dim` bytes;
//! * q8_0 (llama.cpp's block: 32 values share one f16 scale `d = amax / 127`, each an i8
//!   `round(x / d)`): the quants `[n_ctx][head_dim]` i8, then the scales
//!   `[n_ctx][head_dim / 32]` f16, the region padded to 16 bytes — 34 bytes per 32 values.

use crate::error::CudaError;

/// Values per q8_0 block (one f16 scale each).
pub const Q8_BLOCK: usize = 32;

/// Element type of the device KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvElem {
    /// 16-bit floats.
    #[default]
    F16 = 0,
    /// llama.cpp's q8_0 (head sizes that are multiples of 32).
    Q8_0 = 1,
}

impl KvElem {
    /// Whether this element type can hold rows of `head_dim` values.
    pub fn check(self, head_dim: usize) -> Result<(), CudaError> {
        if self == KvElem::Q8_0 && !head_dim.is_multiple_of(Q8_BLOCK) {
            return Err(CudaError::Shape(format!(
                "a q8_0 KV cache needs a head size that is a multiple of {Q8_BLOCK}, not {head_dim}"
            )));
        }
        Ok(())
    }
}

/// Bytes of one KV head's region of a layer (`n_ctx` rows of `head_dim` values).
pub fn kv_head_bytes(elem: KvElem, n_ctx: usize, head_dim: usize) -> usize {
    match elem {
        KvElem::F16 => 2 * n_ctx * head_dim,
        KvElem::Q8_0 => (n_ctx * (head_dim + head_dim / 16)).next_multiple_of(16),
    }
}

/// One head region's rows widened to f32 (`[n_ctx][head_dim]`): the host twin of the
/// kernels' `kv_load`, for tests. `region` holds at least [`kv_head_bytes`] bytes.
pub fn widen_head(elem: KvElem, region: &[u8], n_ctx: usize, head_dim: usize) -> Vec<f32> {
    let n = n_ctx * head_dim;
    match elem {
        KvElem::F16 => region[..2 * n]
            .chunks_exact(2)
            .map(|b| damascus_quant::fp::fp16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        KvElem::Q8_0 => {
            let (qs, d) = region.split_at(n);
            (0..n)
                .map(|e| {
                    let b = 2 * (e / Q8_BLOCK);
                    let scale =
                        damascus_quant::fp::fp16_to_f32(u16::from_le_bytes([d[b], d[b + 1]]));
                    f32::from(qs[e] as i8) * scale
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_regions_cost_34_bytes_per_32_values_and_stay_aligned() {
        assert_eq!(kv_head_bytes(KvElem::F16, 7, 64), 7 * 128);
        assert_eq!(kv_head_bytes(KvElem::Q8_0, 16, 64), 16 * 68);
        for n_ctx in [1, 3, 7, 33, 1023] {
            for hd in [32, 64, 96, 128, 256] {
                let b = kv_head_bytes(KvElem::Q8_0, n_ctx, hd);
                assert_eq!(b % 16, 0);
                assert!(b >= n_ctx * hd / 32 * 34 && b < n_ctx * hd / 32 * 34 + 16);
            }
        }
        assert!(KvElem::Q8_0.check(16).is_err());
        assert!(KvElem::Q8_0.check(96).is_ok());
        assert!(KvElem::F16.check(16).is_ok());
    }

    #[test]
    fn widen_reads_quants_times_their_block_scale() {
        // Two rows of 32: scales 0.5 and 2.0 (f16 0x3800, 0x4000).
        let mut region = vec![0u8; kv_head_bytes(KvElem::Q8_0, 2, 32)];
        for (e, b) in region[..64].iter_mut().enumerate() {
            *b = (e as i8 - 32) as u8;
        }
        region[64..68].copy_from_slice(&[0x00, 0x38, 0x00, 0x40]);
        let w = widen_head(KvElem::Q8_0, &region, 2, 32);
        assert_eq!(w[0], -16.0);
        assert_eq!(w[31], -0.5);
        assert_eq!(w[32], 0.0);
        assert_eq!(w[63], 62.0);
    }
}
