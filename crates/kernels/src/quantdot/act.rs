//! Activation quantization: f32 vectors to Q8_K / Q8_0 / Q8_1 blocks, with the
//! same layout and rounding as ggml's `quantize_row_q8_*_ref`.

use super::{ActType, KernelError, QK, QK_K, f32_to_f16};

/// Q8_K activation block: 256 values, `x ≈ d · qs`, with sums of each 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Quants, in [-127, 127].
    pub qs: [i8; QK_K],
    /// Σ qs over each group of 16.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// Q8_0 block: 32 values, `x ≈ d · qs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// Scale, f16 bits.
    pub d: u16,
    /// Quants.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q8_1 block: like [`BlockQ8_0`] plus `s = d · Σ qs` (for Q4_1's min term).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    /// Scale, f16 bits.
    pub d: u16,
    /// `d · Σ qs`, f16 bits.
    pub s: u16,
    /// Quants.
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

impl BlockQ8K {
    /// An all-zero block.
    pub const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
}
impl BlockQ8_0 {
    /// An all-zero block.
    pub const ZERO: BlockQ8_0 = BlockQ8_0 { d: 0, qs: [0; QK] };
}
impl BlockQ8_1 {
    /// An all-zero block.
    pub const ZERO: BlockQ8_1 = BlockQ8_1 {
        d: 0,
        s: 0,
        qs: [0; QK],
    };
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (valid for
/// |x| ≤ 2^22, which holds for every caller here; garbage but no UB beyond).
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() as i32 & 0x007f_ffff).wrapping_sub(0x0040_0000)
}

/// Scalar twin: quantizes `x` (`[k]` f32, k a multiple of 256) into `out`
/// (`[k / 256]`) exactly like ggml's `quantize_row_q8_K_ref` (except that an all-zero block
/// also gets zero `bsums`).
pub fn quantize_q8_k_ref(x: &[f32], out: &mut [BlockQ8K]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK_K)?;
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in xb {
            let av = v.abs();
            if av > amax {
                amax = av;
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::ZERO;
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
    Ok(())
}

/// Scalar twin: quantizes `x` (`[k]` f32, k a multiple of 32) into `out`
/// (`[k / 32]`) exactly like ggml's `quantize_row_q8_0_ref` (`roundf`, ties away from 0).
pub fn quantize_q8_0_ref(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
    Ok(())
}

/// Scalar twin: quantizes `x` (`[k]` f32) into Q8_1 blocks (`[k / 32]`) exactly like
/// ggml's `quantize_row_q8_1_ref`.
pub fn quantize_q8_1_ref(x: &[f32], out: &mut [BlockQ8_1]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK)?;
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        yb.s = f32_to_f16(sum as f32 * d);
    }
    Ok(())
}

fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::kernels().isa() >= super::Isa::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Quantizes `x` (`[k]` f32, k a multiple of 256) into `out` (`[k / 256]`)
/// Q8_K blocks: the SIMD path when available, else [`quantize_q8_k_ref`];
/// both give identical bits for finite inputs.
pub fn quantize_q8_k(x: &[f32], out: &mut [BlockQ8K]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK_K)?;
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: simd() is true only when AVX2+FMA+F16C were detected.
        unsafe { super::avx2::quantize_q8_k(x, out) };
        return Ok(());
    }
    quantize_q8_k_ref(x, out)
}

/// Quantizes `x` (`[k]` f32, k a multiple of 32) into Q8_0 blocks
/// (`[k / 32]`): SIMD when available, else [`quantize_q8_0_ref`]; identical
/// bits for finite inputs.
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK)?;
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: simd() is true only when AVX2+FMA+F16C were detected.
        unsafe {
            super::avx2::quantize_q8_32(x, |i, d, _, qs| {
                out[i] = BlockQ8_0 { d, qs: *qs };
            })
        };
        return Ok(());
    }
    quantize_q8_0_ref(x, out)
}

/// Quantizes `x` (`[k]` f32, k a multiple of 32) into Q8_1 blocks
/// (`[k / 32]`): SIMD when available, else [`quantize_q8_1_ref`]; identical
/// bits for finite inputs.
pub fn quantize_q8_1(x: &[f32], out: &mut [BlockQ8_1]) -> Result<(), KernelError> {
    check_lens(x.len(), out.len(), QK)?;
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: simd() is true only when AVX2+FMA+F16C were detected.
        unsafe {
            super::avx2::quantize_q8_32(x, |i, d, s, qs| {
                out[i] = BlockQ8_1 { d, s, qs: *qs };
            })
        };
        return Ok(());
    }
    quantize_q8_1_ref(x, out)
}

fn check_lens(k: usize, blocks: usize, qk: usize) -> Result<(), KernelError> {
    if !k.is_multiple_of(qk) || k / qk != blocks {
        return Err(KernelError::BadLength {
            what: "quantized activation blocks",
            expected: k.div_ceil(qk),
            found: blocks,
            unit: "blocks",
        });
    }
    Ok(())
}

/// Borrowed quantized activations (one vector of `k` elements).
#[derive(Clone, Copy, Debug)]
pub enum Acts<'a> {
    /// `[k / 256]` Q8_K blocks.
    Q8K(&'a [BlockQ8K]),
    /// `[k / 32]` Q8_0 blocks.
    Q8_0(&'a [BlockQ8_0]),
    /// `[k / 32]` Q8_1 blocks.
    Q8_1(&'a [BlockQ8_1]),
}

impl Acts<'_> {
    /// Format of these activations.
    pub fn act_type(&self) -> ActType {
        match self {
            Acts::Q8K(_) => ActType::Q8_K,
            Acts::Q8_0(_) => ActType::Q8_0,
            Acts::Q8_1(_) => ActType::Q8_1,
        }
    }

    /// Number of elements covered.
    pub fn n_elems(&self) -> usize {
        match self {
            Acts::Q8K(b) => b.len() * QK_K,
            Acts::Q8_0(b) => b.len() * QK,
            Acts::Q8_1(b) => b.len() * QK,
        }
    }
}

/// Owned, reusable buffer of quantized activations.
#[derive(Clone, Debug)]
pub enum ActBuf {
    /// Q8_K blocks.
    Q8K(Vec<BlockQ8K>),
    /// Q8_0 blocks.
    Q8_0(Vec<BlockQ8_0>),
    /// Q8_1 blocks.
    Q8_1(Vec<BlockQ8_1>),
}

impl ActBuf {
    /// An empty buffer for activations of type `t`.
    pub fn new(t: ActType) -> Self {
        match t {
            ActType::Q8_K => ActBuf::Q8K(Vec::new()),
            ActType::Q8_0 => ActBuf::Q8_0(Vec::new()),
            ActType::Q8_1 => ActBuf::Q8_1(Vec::new()),
        }
    }

    /// Quantizes `x` (`[k]` f32) into this buffer (resized, allocation reused).
    pub fn quantize(&mut self, x: &[f32]) -> Result<(), KernelError> {
        match self {
            ActBuf::Q8K(v) => {
                v.resize(x.len() / QK_K, BlockQ8K::ZERO);
                quantize_q8_k(x, v)
            }
            ActBuf::Q8_0(v) => {
                v.resize(x.len() / QK, BlockQ8_0::ZERO);
                quantize_q8_0(x, v)
            }
            ActBuf::Q8_1(v) => {
                v.resize(x.len() / QK, BlockQ8_1::ZERO);
                quantize_q8_1(x, v)
            }
        }
    }

    /// Borrowed view.
    pub fn as_acts(&self) -> Acts<'_> {
        match self {
            ActBuf::Q8K(v) => Acts::Q8K(v),
            ActBuf::Q8_0(v) => Acts::Q8_0(v),
            ActBuf::Q8_1(v) => Acts::Q8_1(v),
        }
    }
}
