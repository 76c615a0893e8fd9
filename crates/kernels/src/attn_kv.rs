//! The element types of a paged KV pool, as the attention kernels read them: f16 bits
//! ([`F16Rows`]) or llama.cpp's q8_0 blocks ([`Q8Rows`]: 32 values share one f16 scale
//! `d = amax / 127`, each value an i8 `round(x / d)`).
//!
//! Both widen to f32 **exactly**: an f16 is an f32, and `q · d` (a 7-bit integer times an
//! 11-bit significand) fits in the 24 bits of an f32 significand. So a kernel written once over
//! [`KvRows`] does the same arithmetic on the widened values whatever the storage, and its
//! SIMD routes (per-token, tiled, grouped) stay bit-identical to each other for q8_0 as they
//! are for f16. The dequantized values are also what the reference backend keeps when it
//! emulates a q8_0 cache (quantize, then dequantize, on write).

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

use crate::quantdot::{KernelError, f16_to_f32, f32_to_f16};

/// Values per q8_0 block (one scale each).
pub const Q8_BLOCK: usize = 32;

/// A pool of key or value rows `[n_head_kv, n_slots, head_dim]`, read by element index.
///
/// The SIMD loads take 8 or 16 consecutive elements starting at a multiple of 8 (16) that do
/// not cross a q8_0 block: every kernel walks rows from their start (rows start at multiples
/// of `head_dim`) in steps of 8 or 16, and q8_0 pools need `head_dim % 32 == 0`.
pub trait KvRows: Copy + Send + Sync {
    /// Whether the tiled prompt kernel widens a tile's rows into an f32 scratch first (once
    /// per tile instead of once per token: worth it where widening costs several ops).
    const WIDEN_TILES: bool = false;

    /// Elements held.
    fn n_elems(&self) -> usize;

    /// Element `e` widened to f32 (exact).
    fn get(&self, e: usize) -> f32;

    /// `Σ_j q[j] · row[e0 + j]` over `q.len()` elements: the per-token kernel's dot product
    /// (with `simd`, AVX2's two 8-lane chains, as the tiled and grouped kernels compute it).
    fn dot(&self, simd: bool, q: &[f32], e0: usize) -> f32;

    /// `out[j] += s · row[e0 + j]` over `out.len()` elements (one FMA each with `simd`).
    fn axpy(&self, simd: bool, out: &mut [f32], s: f32, e0: usize);

    /// Elements `e..e + 8` widened.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; the elements lie in the pool, `e % 8 == 0`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(&self, e: usize) -> __m256;

    /// Elements `e..e + 16` widened.
    ///
    /// # Safety
    /// AVX-512F and F16C are available; the elements lie in the pool, `e % 16 == 0`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(&self, e: usize) -> __m512;

    /// Elements `e..e + 32` widened, as two [`KvRows::load16`].
    ///
    /// # Safety
    /// As [`KvRows::load16`], for 32 elements, `e % 32 == 0`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load32(&self, e: usize) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { [self.load16(e), self.load16(e + 16)] }
    }

    /// Prefetch hints for elements `e..e + n` (never faults).
    #[cfg(target_arch = "x86_64")]
    fn prefetch(&self, e: usize, n: usize);
}

/// An f16 pool (bits).
#[derive(Clone, Copy, Debug)]
pub struct F16Rows<'a>(pub &'a [u16]);

/// Rows already widened to f32 (the tiled kernel's scratch copy of a q8_0 tile).
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32Rows<'a>(pub(crate) &'a [f32]);

/// A q8_0 pool: `qs[e]` the quantized values, `d[e / 32]` their blocks' f16 scales.
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows<'a> {
    qs: &'a [i8],
    d: &'a [u16],
}

impl<'a> Q8Rows<'a> {
    /// A pool of `qs.len()` values (a multiple of 32) and one scale per 32 of them.
    pub fn new(qs: &'a [i8], d: &'a [u16]) -> Result<Self, KernelError> {
        if !qs.len().is_multiple_of(Q8_BLOCK) || d.len() != qs.len() / Q8_BLOCK {
            return Err(KernelError::BadShape(format!(
                "q8_0 pool of {} values with {} scales (one per {Q8_BLOCK} values)",
                qs.len(),
                d.len()
            )));
        }
        Ok(Self { qs, d })
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_bytes(p: *const u8, n: usize) {
    let mut o = 0;
    while o < n {
        // SAFETY: a prefetch hint never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast()) };
        o += 64;
    }
}

impl KvRows for F16Rows<'_> {
    #[inline(always)]
    fn n_elems(&self) -> usize {
        self.0.len()
    }

    #[inline(always)]
    fn get(&self, e: usize) -> f32 {
        f16_to_f32(self.0[e])
    }

    #[inline(always)]
    fn dot(&self, simd: bool, q: &[f32], e0: usize) -> f32 {
        crate::attn_decode::dot_f16(simd, q, &self.0[e0..e0 + q.len()])
    }

    #[inline(always)]
    fn axpy(&self, simd: bool, out: &mut [f32], s: f32, e0: usize) {
        crate::attn_decode::axpy_f16(simd, out, s, &self.0[e0..e0 + out.len()])
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(&self, e: usize) -> __m256 {
        // SAFETY: the caller guarantees F16C and e..e+8 in the pool.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.as_ptr().add(e).cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(&self, e: usize) -> __m512 {
        // SAFETY: the caller guarantees AVX-512F and e..e+16 in the pool.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.as_ptr().add(e).cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch(&self, e: usize, n: usize) {
        prefetch_bytes(self.0.as_ptr().wrapping_add(e).cast(), 2 * n);
    }
}

impl KvRows for F32Rows<'_> {
    #[inline(always)]
    fn n_elems(&self) -> usize {
        self.0.len()
    }

    #[inline(always)]
    fn get(&self, e: usize) -> f32 {
        self.0[e]
    }

    fn dot(&self, _simd: bool, q: &[f32], e0: usize) -> f32 {
        q.iter().zip(&self.0[e0..]).map(|(&a, &b)| a * b).sum()
    }

    fn axpy(&self, _simd: bool, out: &mut [f32], s: f32, e0: usize) {
        for (o, &b) in out.iter_mut().zip(&self.0[e0..]) {
            *o += s * b;
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(&self, e: usize) -> __m256 {
        // SAFETY: the caller guarantees AVX and e..e+8 in the slice.
        unsafe { _mm256_loadu_ps(self.0.as_ptr().add(e)) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(&self, e: usize) -> __m512 {
        // SAFETY: the caller guarantees AVX-512F and e..e+16 in the slice.
        unsafe { _mm512_loadu_ps(self.0.as_ptr().add(e)) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch(&self, e: usize, n: usize) {
        prefetch_bytes(self.0.as_ptr().wrapping_add(e).cast(), 4 * n);
    }
}

impl Q8Rows<'_> {
    /// The f16 scale of element `e`'s block, widened with F16C.
    ///
    /// # Safety
    /// F16C is available; `e` lies in the pool.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scale(&self, e: usize) -> f32 {
        // SAFETY: e / 32 < d.len() (checked at construction: d covers every value).
        unsafe {
            let d = *self.d.get_unchecked(e / Q8_BLOCK);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d as i32)))
        }
    }
}

impl KvRows for Q8Rows<'_> {
    const WIDEN_TILES: bool = true;

    #[inline(always)]
    fn n_elems(&self) -> usize {
        self.qs.len()
    }

    #[inline(always)]
    fn get(&self, e: usize) -> f32 {
        self.qs[e] as f32 * f16_to_f32(self.d[e / Q8_BLOCK])
    }

    #[inline(always)]
    fn dot(&self, simd: bool, q: &[f32], e0: usize) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if simd && e0.is_multiple_of(8) {
            assert!(e0 + q.len() <= self.qs.len(), "q8_0 row outside the pool");
            // SAFETY: `simd` is only true when AVX2+FMA+F16C were detected; the row lies in
            // the pool (asserted) and starts at a multiple of 8.
            return unsafe { x86::dot(self, q, e0) };
        }
        let _ = simd;
        q.iter()
            .enumerate()
            .map(|(j, &a)| a * self.get(e0 + j))
            .sum()
    }

    #[inline(always)]
    fn axpy(&self, simd: bool, out: &mut [f32], s: f32, e0: usize) {
        #[cfg(target_arch = "x86_64")]
        if simd && e0.is_multiple_of(8) {
            assert!(e0 + out.len() <= self.qs.len(), "q8_0 row outside the pool");
            // SAFETY: as in `dot`.
            return unsafe { x86::axpy(self, out, s, e0) };
        }
        let _ = simd;
        for (j, o) in out.iter_mut().enumerate() {
            *o += s * self.get(e0 + j);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(&self, e: usize) -> __m256 {
        // SAFETY: the caller guarantees AVX2+F16C and e..e+8 in the pool (one block: e % 8 == 0).
        unsafe {
            let q = _mm_loadl_epi64(self.qs.as_ptr().add(e).cast());
            let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_mul_ps(x, _mm256_set1_ps(self.scale(e)))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(&self, e: usize) -> __m512 {
        // SAFETY: the caller guarantees AVX-512F+F16C and e..e+16 in the pool (one block).
        unsafe {
            let q = _mm_loadu_si128(self.qs.as_ptr().add(e).cast());
            let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            _mm512_mul_ps(x, _mm512_set1_ps(self.scale(e)))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load32(&self, e: usize) -> [__m512; 2] {
        // SAFETY: the caller guarantees AVX-512F+F16C and e..e+32 in the pool (one block).
        unsafe {
            let q = _mm256_loadu_si256(self.qs.as_ptr().add(e).cast());
            let d = _mm512_set1_ps(self.scale(e));
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(q)));
            [_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d)]
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn prefetch(&self, e: usize, n: usize) {
        prefetch_bytes(self.qs.as_ptr().wrapping_add(e).cast(), n);
        prefetch_bytes(self.d.as_ptr().wrapping_add(e / Q8_BLOCK).cast(), 1);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use super::{KvRows, Q8Rows};

    /// `attn_decode::x86::hsum`, operation for operation.
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register-only AVX ops in an AVX-enabled caller.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// `attn_decode::x86::dot_f16` over widened q8_0 values.
    ///
    /// # Safety
    /// AVX2+FMA+F16C; `e0 % 8 == 0`, elements `e0..e0 + q.len()` in the pool.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(r: &Q8Rows<'_>, q: &[f32], e0: usize) -> f32 {
        let n = q.len();
        let n8 = n / 8 * 8;
        // SAFETY: 8-wide accesses at i..i+8 ≤ n8 ≤ n within q and the row.
        unsafe {
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n8 {
                let k0 = r.load8(e0 + i);
                let k1 = r.load8(e0 + i + 8);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), k0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), k1, a1);
                i += 16;
            }
            if i < n8 {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), r.load8(e0 + i), a0);
            }
            let mut s = hsum(_mm256_add_ps(a0, a1));
            for (j, &x) in q.iter().enumerate().skip(n8) {
                s += x * r.get(e0 + j);
            }
            s
        }
    }

    /// `attn_decode::x86::axpy_f16` over widened q8_0 values.
    ///
    /// # Safety
    /// As [`dot`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy(r: &Q8Rows<'_>, out: &mut [f32], s: f32, e0: usize) {
        let n = out.len();
        let n8 = n / 8 * 8;
        // SAFETY: 8-wide accesses at i..i+8 ≤ n8 ≤ n within out and the row.
        unsafe {
            let sv = _mm256_set1_ps(s);
            let mut i = 0;
            while i < n8 {
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(sv, r.load8(e0 + i), _mm256_loadu_ps(o)));
                i += 8;
            }
        }
        for (j, o) in out.iter_mut().enumerate().skip(n8) {
            *o += s * r.get(e0 + j);
        }
    }
}

/// Quantizes `x` to q8_0 as llama.cpp's `quantize_row_q8_0_ref` does: per block of 32,
/// `d = amax / 127`, `qs = round(x / d)` (half away from zero), `d` stored as f16.
///
/// * `x`: `[n]` f32, `n` a multiple of 32
/// * `qs`: `[n]`, `d`: `[n / 32]`
pub fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [u16]) -> Result<(), KernelError> {
    if !x.len().is_multiple_of(Q8_BLOCK) || qs.len() != x.len() || d.len() != x.len() / Q8_BLOCK {
        return Err(KernelError::BadShape(format!(
            "q8_0: {} values into {} quants and {} scales",
            x.len(),
            qs.len(),
            d.len()
        )));
    }
    for ((xb, qb), db) in x
        .chunks_exact(Q8_BLOCK)
        .zip(qs.chunks_exact_mut(Q8_BLOCK))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        *db = f32_to_f16(scale);
        for (q, &v) in qb.iter_mut().zip(xb) {
            // `as` saturates (and sends NaN to 0): no value leaves i8.
            *q = (v * inv).round() as i8;
        }
    }
    Ok(())
}

/// `x ← dequant(quant(x))` in place: what a q8_0 cache gives back for `x` (`x.len()` a
/// multiple of 32). The reference backend's emulation of a q8_0 cache.
pub fn round_trip_q8_0(x: &mut [f32]) -> Result<(), KernelError> {
    let mut qs = vec![0i8; x.len()];
    let mut d = vec![0u16; x.len() / Q8_BLOCK];
    quantize_q8_0(x, &mut qs, &mut d)?;
    let rows = Q8Rows::new(&qs, &d)?;
    for (e, v) in x.iter_mut().enumerate() {
        *v = rows.get(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn_decode::tests::data;

    #[test]
    fn quantize_matches_the_definition_and_round_trips_closely() {
        let mut x = data(5, 32 * 7, 3.0);
        x[0] = 0.0;
        x[40..72].fill(0.0); // an all-zero block: d = 0, every q = 0
        let mut qs = vec![0i8; x.len()];
        let mut d = vec![0u16; x.len() / 32];
        quantize_q8_0(&x, &mut qs, &mut d).unwrap();
        for b in 0..x.len() / 32 {
            let xb = &x[b * 32..(b + 1) * 32];
            let amax = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
            assert_eq!(d[b], f32_to_f16(amax / 127.0));
            assert!(qs[b * 32..(b + 1) * 32].iter().any(|&q| q.abs() == 127) || amax == 0.0);
        }
        let mut y = x.clone();
        round_trip_q8_0(&mut y).unwrap();
        for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, &v| m.max(v.abs()));
            for (a, c) in xb.iter().zip(yb) {
                // Half a step, plus up to 127 steps of the f16 rounding of d (2^-11 relative).
                assert!(
                    (a - c).abs() <= amax / 127.0 * 0.57 + 1e-6,
                    "block {b}: {a} vs {c}"
                );
            }
        }
        assert!(quantize_q8_0(&x[..33], &mut qs[..33], &mut d[..1]).is_err());
        assert!(Q8Rows::new(&qs[..64], &d[..1]).is_err());
    }

    /// The SIMD loads, dot and axpy widen exactly as `get` does.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_widening_is_exact() {
        if !crate::quantdot::Isa::Avx2.is_available() {
            return;
        }
        let x = data(9, 32 * 5, 2.0);
        let mut qs = vec![0i8; x.len()];
        let mut d = vec![0u16; x.len() / 32];
        quantize_q8_0(&x, &mut qs, &mut d).unwrap();
        let r = Q8Rows::new(&qs, &d).unwrap();
        for e in (0..x.len()).step_by(8) {
            // SAFETY: AVX2+FMA+F16C detected above; e..e+8 in the pool.
            let v = unsafe { r.load8(e) };
            let mut got = [0f32; 8];
            // SAFETY: 8 floats written to an 8-float array.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), v) };
            for (j, g) in got.iter().enumerate() {
                assert_eq!(g.to_bits(), r.get(e + j).to_bits());
            }
        }
        let q = data(3, 64, 1.0);
        for e0 in [0usize, 32, 96] {
            let scalar = r.dot(false, &q, e0);
            let simd = r.dot(true, &q, e0);
            assert!((scalar - simd).abs() <= 1e-4 * (1.0 + scalar.abs()));
            let (mut a, mut b) = (vec![0.5f32; 64], vec![0.5f32; 64]);
            r.axpy(false, &mut a, 0.3, e0);
            r.axpy(true, &mut b, 0.3, e0);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + x.abs()));
            }
        }
    }
}
