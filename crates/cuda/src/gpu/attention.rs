//! RoPE and attention over the KV cache (f16, or q8_0: [`crate::KvElem`]): the fused RoPE +
//! cache write (`rope_kv`; `rope_kv_q8` quantizes each 32-value block of a head's row as the
//! CPU's `quantize_q8_0` does), decode attention split over the KV length (positions per split
//! chosen by depth) with a combine step, and prompt attention, on tensor cores (`attn_flash_*`,
//! `kernels/flash.cu`) or on CUDA cores (`attn_prefill_*`, the fallback when the flash path is
//! off). Every cache-reading kernel has an f16 and a q8_0 (`_q8`) instantiation of one device
//! function, reading rows through the kernels' `kv_load`.
//! Decode takes the streamed kernel (`attn_decode_*`, `kernels/attn_decode.cu`) on an f16
//! cache for head sizes 64/128/256 when [`Gpu::set_attn_v2`] turns it on, else `attn_split_*`
//! (its twin); both feed one combine.

use std::sync::atomic::Ordering;

use super::Gpu;
use super::buffers::{ATT_CHUNK_MIN, DevAct, DevKv, DevVec, MAX_GROUP};
use super::launch::{
    AttnCombine, AttnDecode, AttnFlash, AttnPrefill, AttnSplit, Ptr, Rope, RopeKv, attn_variant,
    decode_variant, head_variant,
};
use super::ops::div_ceil_u32;
use crate::KvElem;
use crate::error::CudaError;

/// Threads of a decode split block (the kernel's `ATT_THREADS`).
pub(super) const ATT_THREADS: u32 = 256;
/// Most positions per decode split (the kernel's `ATT_CHUNK_MAX`).
const ATT_CHUNK_MAX: usize = 256;
/// Query rows (token x head-of-group pairs) per flash block, and its threads (the kernel's
/// `FA_ROWS`, four warps of 16 rows).
pub(super) const FA_ROWS: usize = 64;
pub(super) const FA_THREADS: u32 = 128;

/// Threads of a streamed decode block (the kernel's `AD_THREADS`).
pub(super) const AD_THREADS: u32 = 128;
/// Positions per K/V tile of the streamed decode kernel (its `AD_TILE`).
const AD_TILE: usize = 32;

/// Stages of the streamed decode kernel's K/V tile ring for head size `d` (its `AD_STAGES`).
fn attn_decode_stages(d: usize) -> usize {
    match d {
        0..=64 => 4,
        65..=128 => 3,
        _ => 2,
    }
}

/// Dynamic shared memory of one streamed decode block for head size `d` (the kernel's
/// `AD_REGION(D)` plus the weights `[MAX_GROUP][AD_TILE]` and corrections `[MAX_GROUP]`, f32):
/// the ring of K and V tiles `[stages][2][AD_TILE][d]` f16, or the position groups' partial
/// outputs `[MAX_GROUP]` × 4 KiB f32, whichever is larger.
pub(super) fn attn_decode_smem(d: usize) -> u32 {
    let ring = attn_decode_stages(d) * 2 * AD_TILE * d * 2;
    let region = ring.max(MAX_GROUP * AD_THREADS as usize * 8 * 4);
    (region + (MAX_GROUP * AD_TILE + MAX_GROUP) * 4) as u32
}

/// Options of one attention call beyond its shapes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    /// Score scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Sliding window: a query at position p sees keys at `p - window + 1..=p`; 0 = unbounded.
    pub window: usize,
}

/// Positions per decode split for `n_pos` cached positions: at least `ATT_CHUNK_MIN`, a
/// power of two, growing with the depth so there stay about 64 splits per KV head (enough
/// blocks to fill the device; fewer, longer splits waste less on per-block setup and on the
/// combine).
pub fn decode_chunk(n_pos: usize) -> usize {
    (n_pos / 64)
        .next_power_of_two()
        .clamp(ATT_CHUNK_MIN, ATT_CHUNK_MAX)
}

/// Dynamic shared memory of one flash block for head size `d`: Q (`FA_ROWS` rows) and two
/// buffers of K and V tiles (`BK` rows: 64, or 32 for `d` 256), each row `d + 8` halfs.
pub(super) fn flash_smem(d: usize) -> u32 {
    let bk = if d > 128 { 32 } else { 64 };
    ((FA_ROWS + 4 * bk) * (d + 8) * 2) as u32
}

/// The head size in a flash kernel's name after `attn_flash_`: `[paged_]D[_q8]` (the q8_0
/// twins stage f16 tiles, so they need the same shared memory as the f16 kernels).
pub(super) fn flash_kernel_head_size(suffix: &str) -> Option<usize> {
    let d = suffix.trim_start_matches("paged_");
    d.strip_suffix("_q8").unwrap_or(d).parse().ok()
}

impl Gpu {
    /// Turns the streamed decode attention (`kernels/attn_decode.cu`) on or off (off at
    /// first; `KernelSettings::cuda_attn_v2`). It serves head sizes 64, 128 and 256; others,
    /// and a device that cannot give it its shared memory, keep `attn_split`.
    pub fn set_attn_v2(&self, on: bool) {
        self.attn_v2_enabled
            .store(on && self.attn_v2_ok, Ordering::Relaxed);
    }

    /// Whether decode attention takes the streamed kernel (where it serves the head size).
    pub fn attn_v2(&self) -> bool {
        self.attn_v2_enabled.load(Ordering::Relaxed)
    }

    /// The streamed decode kernel's variant for head size `hd`, when it is on and serves it.
    pub(super) fn attn_v2_variant(&self, hd: usize, elem: KvElem) -> Option<usize> {
        if elem == KvElem::F16 && self.attn_v2_enabled.load(Ordering::Relaxed) {
            decode_variant(hd)
        } else {
            None
        }
    }

    /// Rotates `x` `[n, n_head, head_dim]` in place at positions `pos0 + t` (from `begin`).
    pub fn rope(
        &self,
        x: &DevAct,
        n_head: usize,
        head_dim: usize,
        inv_freq: &DevVec,
        neox: bool,
    ) -> Result<(), CudaError> {
        let half = inv_freq.n;
        if x.width != n_head * head_dim || 2 * half > head_dim {
            return Err(CudaError::Shape(format!(
                "rope: width {} for {n_head} heads of {head_dim} with {half} frequencies",
                x.width
            )));
        }
        let inputs = self.rec().inputs.ptr;
        let n = x.n * n_head * half;
        self.push(
            Rope {
                x: x.x.ptr,
                inputs,
                inv_freq: inv_freq.buf.ptr,
                n_tok: x.n as i32,
                n_head: n_head as i32,
                head_dim: head_dim as i32,
                half: half as i32,
                neox,
            },
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `k`, `v` into `layer` of the cache at `pos0 + t`, then causal GQA attention of
    /// `q` over positions `0..=pos0 + t` into `out`. The caller checked `pos0 + n <= n_ctx`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        kv: &DevKv,
        layer: usize,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
    ) -> Result<(), CudaError> {
        self.rope_attention(kv, layer, pos0, q, k, v, out, None)
    }

    /// [`Gpu::attention`] with RoPE fused into the cache write: with `rope = Some((inv_freq,
    /// neox))`, `q` is rotated in place and `k` rotated on its way into the cache (`k` itself
    /// is left as it was), as [`Gpu::rope`] on both would.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention(
        &self,
        kv: &DevKv,
        layer: usize,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
        rope: Option<(&DevVec, bool)>,
    ) -> Result<(), CudaError> {
        let p = AttnParams::default();
        self.rope_attention_with(kv, layer, pos0, q, k, v, out, rope, p)
    }

    /// [`Gpu::rope_attention`] with a score scale override and a sliding window.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention_with(
        &self,
        kv: &DevKv,
        layer: usize,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
        rope: Option<(&DevVec, bool)>,
        params: AttnParams,
    ) -> Result<(), CudaError> {
        let (hd, n_kv, n_head) = (kv.head_dim, kv.n_kv, kv.n_head);
        let n = q.n;
        if layer >= kv.n_layer
            || q.width != n_head * hd
            || k.width != n_kv * hd
            || v.width != n_kv * hd
            || k.n != n
            || v.n != n
            || out.n != n
            || out.width != q.width
            || pos0 + n > kv.n_ctx
        {
            return Err(CudaError::Shape(format!(
                "attention: layer {layer}, q [{n}, {}], k [{}, {}], v [{}, {}], out [{}, {}], \
                 positions {pos0}..{} of {}",
                q.width,
                k.n,
                k.width,
                v.n,
                v.width,
                out.n,
                out.width,
                pos0 + n,
                kv.n_ctx
            )));
        }
        let (half, inv, neox) = match rope {
            Some((inv, neox)) => (inv.n, inv.buf.ptr, neox),
            None => (0, Ptr::NULL, false),
        };
        if 2 * half > hd {
            return Err(CudaError::Shape(format!(
                "attention: {half} rope frequencies for head_dim {hd}"
            )));
        }
        let variant = head_variant(hd)
            .ok_or_else(|| CudaError::Shape(format!("attention: head_dim {hd}")))?;
        // The cache-reading kernels' variant (head size and element type).
        let kvv = attn_variant(hd, kv.elem).ok_or_else(|| {
            CudaError::Shape(format!(
                "attention: head_dim {hd} with a {:?} cache",
                kv.elem
            ))
        })?;
        let group = n_head / n_kv;
        debug_assert!((1..=MAX_GROUP).contains(&group));
        let window = i32::try_from(params.window)
            .map_err(|_| CudaError::Shape(format!("attention window {}", params.window)))?;
        let inputs = self.rec().inputs.ptr;
        let layer_off = layer * kv.layer_bytes();
        let (kc, vc) = (kv.k.ptr.at(layer_off), kv.v.ptr.at(layer_off));
        let total = n * (n_head + n_kv) * hd / 2;
        self.push(
            RopeKv {
                variant: kv.elem as usize,
                q: q.x.ptr,
                k: k.x.ptr,
                v: v.x.ptr,
                kc,
                vc,
                inputs,
                inv_freq: inv,
                n_tok: n as i32,
                n_head: n_head as i32,
                n_kv: n_kv as i32,
                head_dim: hd as i32,
                half: half as i32,
                neox,
                n_ctx: kv.n_ctx as i32,
            },
            [div_ceil_u32(total, 256), 1, 1],
            [256, 1, 1],
        );
        if half > 0 {
            q.q_fresh.store(false, Ordering::Relaxed);
        }
        let scale = params.scale.unwrap_or(1.0 / (hd as f32).sqrt());
        if n == 1 {
            let chunk = decode_chunk(pos0 + 1);
            let n_split = kv.n_ctx.div_ceil(chunk);
            debug_assert!(n_split <= kv.max_split);
            let split = AttnSplit {
                variant: kvv,
                q: q.x.ptr,
                kc,
                vc,
                inputs,
                part_o: kv.part_o.ptr,
                part_ml: kv.part_ml.ptr,
                n_head: n_head as i32,
                group: group as i32,
                n_ctx: kv.n_ctx as i32,
                n_split: n_split as i32,
                chunk: chunk as i32,
                scale,
                window,
            };
            let grid = [n_kv as u32, n_split as u32, 1];
            match self.attn_v2_variant(hd, kv.elem) {
                Some(v) => self.push_smem(
                    AttnDecode {
                        variant: v,
                        q: split.q,
                        kc,
                        vc,
                        inputs,
                        part_o: split.part_o,
                        part_ml: split.part_ml,
                        n_head: split.n_head,
                        group: split.group,
                        n_ctx: split.n_ctx,
                        n_split: split.n_split,
                        chunk: split.chunk,
                        scale,
                        window,
                    },
                    grid,
                    [AD_THREADS, 1, 1],
                    attn_decode_smem(hd),
                ),
                None => self.push(split, grid, [ATT_THREADS, 1, 1]),
            }
            // The combine quantizes whole warps of one head: a head under 32 dims leaves the
            // shadow stale (re-made from f32 by the next GEMV).
            let do_q = out.q.is_some() && hd >= 32;
            let (oq, ods) = out.q8_ptrs();
            self.push(
                AttnCombine {
                    variant,
                    part_o: kv.part_o.ptr,
                    part_ml: kv.part_ml.ptr,
                    inputs,
                    out: out.x.ptr,
                    q: oq,
                    ds: ods,
                    n_split: n_split as i32,
                    chunk: chunk as i32,
                    do_q,
                    window,
                },
                [n_head as u32, 1, 1],
                [hd as u32, 1, 1],
            );
            out.q_fresh.store(do_q, Ordering::Relaxed);
            return Ok(());
        }
        if self.flash_enabled.load(Ordering::Relaxed) {
            self.push_smem(
                AttnFlash {
                    variant: kvv,
                    q: q.x.ptr,
                    kc,
                    vc,
                    inputs,
                    out: out.x.ptr,
                    n_tok: n as i32,
                    n_head: n_head as i32,
                    group: group as i32,
                    n_ctx: kv.n_ctx as i32,
                    scale,
                    window,
                },
                [n_kv as u32, div_ceil_u32(n * group, FA_ROWS), 1],
                [FA_THREADS, 1, 1],
                flash_smem(hd),
            );
        } else {
            self.push(
                AttnPrefill {
                    variant: kvv,
                    q: q.x.ptr,
                    kc,
                    vc,
                    inputs,
                    out: out.x.ptr,
                    n_tok: n as i32,
                    n_head: n_head as i32,
                    group: group as i32,
                    n_ctx: kv.n_ctx as i32,
                    scale,
                    window,
                },
                [n_kv as u32, div_ceil_u32(n, 4), 1],
                [128, 1, 1],
            );
        }
        out.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_chunk_grows_with_depth_within_bounds() {
        assert_eq!(decode_chunk(1), 32);
        assert_eq!(decode_chunk(2048), 32);
        assert_eq!(decode_chunk(4097), 64);
        assert_eq!(decode_chunk(8193), 128);
        assert_eq!(decode_chunk(16385), 256);
        assert_eq!(decode_chunk(1 << 20), 256);
        for n in [1, 33, 1000, 5000, 70000] {
            assert!(decode_chunk(n).is_power_of_two());
        }
    }

    #[test]
    fn every_flash_kernel_name_gives_its_head_size() {
        // A name that does not parse would launch past 48 KiB without the attribute set.
        let flash: Vec<&str> = super::super::launch::KERNELS
            .iter()
            .filter_map(|k| k.strip_prefix("attn_flash_"))
            .collect();
        assert!(flash.len() >= 20, "{flash:?}");
        for k in flash {
            let d = flash_kernel_head_size(k).unwrap_or_else(|| panic!("attn_flash_{k}"));
            assert!(
                [16, 32, 64, 96, 128, 256].contains(&d),
                "attn_flash_{k}: {d}"
            );
        }
        assert_eq!(flash_kernel_head_size("paged_64_q8"), Some(64));
    }

    #[test]
    fn attn_decode_smem_fits_every_head_size_and_group() {
        // The ring of K and V tiles (4 x 8 KiB, 3 x 16 KiB, 2 x 32 KiB), or 4 KiB of partial
        // output per head of a full group.
        assert_eq!(attn_decode_smem(64), 32768 + 1056);
        assert_eq!(attn_decode_smem(128), 49152 + 1056);
        assert_eq!(attn_decode_smem(256), 65536 + 1056);
        for d in super::super::launch::DECODE_HEAD_DIMS {
            // Under the 227 KiB a Hopper block may take, and several blocks per SM.
            assert!(attn_decode_smem(d) <= 227 * 1024 / 3, "head size {d}");
        }
    }
}
