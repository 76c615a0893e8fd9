//! Decode attention (one new query token) over an f16 KV cache, vectorized
//! with F16C (`vcvtph2ps`) + FMA, with a scalar twin.
//!
//! Query heads sharing a KV head (GQA) are processed together so each cached
//! key/value row is read once per group; KV heads are split across pool
//! threads.

use crate::pool::ThreadPool;
use crate::quantdot::{Isa, KernelError, f16_to_f32, kernels};

/// Memory layout of the K and V caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvLayout {
    /// `[n_ctx, n_head_kv, head_dim]`: one row per position (appends are contiguous).
    #[default]
    PosMajor,
    /// `[n_head_kv, n_ctx, head_dim]`: each head's keys contiguous (streams
    /// best when heads are split across threads).
    HeadMajor {
        /// Positions allocated per head.
        n_ctx: usize,
    },
}

/// Head geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (`n_head` is a multiple of it).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Layout of the caches.
    pub layout: KvLayout,
}

impl DecodeShape {
    fn check(
        &self,
        q: &[f32],
        k: &[u16],
        v: &[u16],
        n_kv: usize,
        out: &[f32],
    ) -> Result<(), KernelError> {
        let DecodeShape {
            n_head,
            n_head_kv,
            head_dim,
            layout,
        } = *self;
        let bad = |m: String| Err(KernelError::BadShape(m));
        if n_head_kv == 0 || head_dim == 0 || n_head % n_head_kv != 0 {
            return bad(format!(
                "n_head {n_head} is not a positive multiple of n_head_kv {n_head_kv} (head_dim {head_dim})"
            ));
        }
        if q.len() != n_head * head_dim || out.len() != q.len() {
            return bad(format!(
                "q/out hold {}/{} floats, expected {}",
                q.len(),
                out.len(),
                n_head * head_dim
            ));
        }
        let need = match layout {
            KvLayout::PosMajor => n_kv.saturating_mul(n_head_kv * head_dim),
            // The last head's rows end at position n_kv: a caller may pass the cache from a
            // later start (a sliding window), shorter than the whole n_head_kv · n_ctx.
            KvLayout::HeadMajor { n_ctx } if n_kv <= n_ctx => ((n_head_kv - 1) * n_ctx)
                .saturating_add(n_kv)
                .saturating_mul(head_dim),
            KvLayout::HeadMajor { n_ctx } => {
                return bad(format!("n_kv {n_kv} exceeds n_ctx {n_ctx}"));
            }
        };
        if n_kv == 0 || k.len() < need || v.len() < need {
            return bad(format!(
                "k/v caches hold {}/{} halves, need {need} for n_kv {n_kv}",
                k.len(),
                v.len()
            ));
        }
        Ok(())
    }

    /// Offset (in halves) of position `p`, KV head `kvh` in a cache.
    #[inline]
    fn offset(&self, p: usize, kvh: usize) -> usize {
        match self.layout {
            KvLayout::PosMajor => (p * self.n_head_kv + kvh) * self.head_dim,
            KvLayout::HeadMajor { n_ctx } => (kvh * n_ctx + p) * self.head_dim,
        }
    }
}

/// Attention output of one decode step.
///
/// * `q`: `[n_head, head_dim]` f32 (already rotated)
/// * `k`, `v`: f16 bits in `shape.layout` (`[n_ctx, n_head_kv, head_dim]` or
///   `[n_head_kv, n_ctx, head_dim]`); positions `0..n_kv` valid
/// * `out`: `[n_head, head_dim]` f32
///
/// Query head `h` uses KV head `h / (n_head / n_head_kv)` and attends to
/// positions `0..n_kv` with scale `1 / sqrt(head_dim)`.
pub fn attn_decode_f16(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    n_kv: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    attn_decode_f16_with(
        kernels().isa() >= Isa::Avx2,
        q,
        k,
        v,
        shape,
        n_kv,
        out,
        pool,
    )
}

/// The scalar twin of [`attn_decode_f16`] (single-threaded).
pub fn attn_decode_f16_scalar(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    n_kv: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attn_decode_f16_with(false, q, k, v, shape, n_kv, out, None)
}

#[allow(clippy::too_many_arguments)]
fn attn_decode_f16_with(
    simd: bool,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    n_kv: usize,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    shape.check(q, k, v, n_kv, out)?;
    #[cfg(target_arch = "x86_64")]
    let simd = simd && Isa::Avx2.is_available();
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let Some(pool) = pool.filter(|p| p.n_threads() > 1 && shape.n_head_kv > 1) else {
        let mut scores = Vec::new();
        for kvh in 0..shape.n_head_kv {
            let o = &mut out[kvh * group * hd..(kvh + 1) * group * hd];
            kv_head(simd, q, k, v, shape, n_kv, kvh, o, &mut scores);
        }
        return Ok(());
    };
    // One KV head (its whole GQA group of query heads) per chunk, handed out over the pool.
    pool.for_each_chunk_mut(out, group * hd, &|kvh, o| {
        let mut scores = Vec::new();
        kv_head(simd, q, k, v, shape, n_kv, kvh, o, &mut scores);
    });
    Ok(())
}

/// All query heads of KV head `kvh`; `out`: `[group, head_dim]`.
#[allow(clippy::too_many_arguments)]
fn kv_head(
    simd: bool,
    q: &[f32],
    k: &[u16],
    v: &[u16],
    shape: DecodeShape,
    n_kv: usize,
    kvh: usize,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let qg = &q[kvh * group * hd..(kvh + 1) * group * hd]; // [group, hd]
    scores.clear();
    scores.resize(group * n_kv, 0.0); // [group, n_kv]
    for p in 0..n_kv {
        let kr = &k[shape.offset(p, kvh)..][..hd];
        for g in 0..group {
            let qh = &qg[g * hd..(g + 1) * hd];
            scores[g * n_kv + p] = dot_f16(simd, qh, kr) * scale;
        }
    }
    for s in scores.chunks_exact_mut(n_kv) {
        softmax(simd, s);
    }
    out.fill(0.0);
    for p in 0..n_kv {
        let vr = &v[shape.offset(p, kvh)..][..hd];
        for g in 0..group {
            axpy_f16(
                simd,
                &mut out[g * hd..(g + 1) * hd],
                scores[g * n_kv + p],
                vr,
            );
        }
    }
}

#[inline]
pub(crate) fn dot_f16(simd: bool, q: &[f32], k: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true when AVX2+FMA+F16C were detected.
        return unsafe { x86::dot_f16(q, k) };
    }
    let _ = simd;
    q.iter().zip(k).map(|(&a, &b)| a * f16_to_f32(b)).sum()
}

#[inline]
pub(crate) fn axpy_f16(simd: bool, out: &mut [f32], s: f32, v: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true when AVX2+FMA+F16C were detected.
        return unsafe { x86::axpy_f16(out, s, v) };
    }
    let _ = simd;
    for (o, &b) in out.iter_mut().zip(v) {
        *o += s * f16_to_f32(b);
    }
}

/// [`softmax`]`(true, s)` bit for bit, with the exponentials 16 lanes at a time (the sum
/// still adds 8-lane chunks in order, as the AVX2 loop).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn softmax_avx512(s: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    let max = unsafe { x86::max16(s) };
    // SAFETY: forwarded from the caller.
    let sum = unsafe { x86::exp_sub_sum16(s, max) };
    let inv = 1.0 / sum;
    // SAFETY: forwarded from the caller.
    unsafe { x86::scale16(s, inv) };
}

pub(crate) fn softmax(simd: bool, s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is only true when AVX2+FMA+F16C were detected.
        let sum = unsafe { x86::exp_sub_sum(s, max) };
        let inv = 1.0 / sum;
        s.iter_mut().for_each(|x| *x *= inv);
        return;
    }
    let _ = simd;
    let mut sum = 0f32;
    for x in s.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use core::arch::x86_64::*;

    use crate::quantdot::f16_to_f32;

    /// The horizontal sum of the AVX2 kernels (the grouped kernel repeats it operation for
    /// operation, so its scores keep these bits).
    ///
    /// # Safety
    /// The caller has AVX enabled.
    #[inline(always)]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: register-only AVX ops in an AVX-enabled caller.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }

    /// Σ q·f16(k) over min(len) elements.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(q: &[f32], k: &[u16]) -> f32 {
        let n = q.len().min(k.len());
        let n8 = n / 8 * 8;
        // SAFETY: every 8-wide load reads indices i..i+8 ≤ n8 ≤ len of both.
        unsafe {
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= n8 {
                let k0 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i) as *const __m128i));
                let k1 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i + 8) as *const __m128i));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), k0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), k1, a1);
                i += 16;
            }
            if i < n8 {
                let k0 = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i) as *const __m128i));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), k0, a0);
            }
            let mut s = hsum(_mm256_add_ps(a0, a1));
            for j in n8..n {
                s += q[j] * f16_to_f32(k[j]);
            }
            s
        }
    }

    /// out += s · f16(v) over min(len) elements.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(out: &mut [f32], s: f32, v: &[u16]) {
        let n = out.len().min(v.len());
        let n8 = n / 8 * 8;
        // SAFETY: 8-wide accesses at i..i+8 ≤ n8 ≤ len of both slices.
        unsafe {
            let sv = _mm256_set1_ps(s);
            let mut i = 0;
            while i < n8 {
                let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i) as *const __m128i));
                let o = out.as_mut_ptr().add(i);
                _mm256_storeu_ps(o, _mm256_fmadd_ps(sv, vv, _mm256_loadu_ps(o)));
                i += 8;
            }
        }
        for j in n8..n {
            out[j] += s * f16_to_f32(v[j]);
        }
    }

    /// exp(x) for 8 lanes: range reduction x = n·ln2 + r, degree-6 polynomial
    /// on r (rel. error ~2e-7), exponent via integer add; clamps below −87.
    #[inline(always)]
    unsafe fn exp8(x: __m256) -> __m256 {
        // SAFETY: register-only AVX2/FMA ops in an AVX2+FMA caller.
        unsafe {
            let x = _mm256_max_ps(
                _mm256_min_ps(x, _mm256_set1_ps(88.0)),
                _mm256_set1_ps(-87.3),
            );
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm256_set1_ps(1.987_569_1e-4);
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_2e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
            p = _mm256_fmadd_ps(
                p,
                _mm256_mul_ps(r, r),
                _mm256_add_ps(r, _mm256_set1_ps(1.0)),
            );
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            _mm256_mul_ps(p, _mm256_castsi256_ps(e))
        }
    }

    /// The largest non-NaN value of `s` (−∞ when none), as `fold(−∞, f32::max)`: `vmaxps`
    /// returns its second operand when either is NaN, and the running maximum never is. (The
    /// two may differ in the sign of a zero maximum, which no `x − max` then sees.)
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn max16(s: &[f32]) -> f32 {
        let n16 = s.len() / 16 * 16;
        // SAFETY: 16-wide loads at i..i+16 ≤ n16; the masked tail reads only s.len() - n16
        // lanes.
        unsafe {
            let p = s.as_ptr();
            let mut m = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
            let mut i = 0;
            while i + 64 <= n16 {
                for (j, m) in m.iter_mut().enumerate() {
                    *m = _mm512_max_ps(_mm512_loadu_ps(p.add(i + 16 * j)), *m);
                }
                i += 64;
            }
            while i < n16 {
                m[0] = _mm512_max_ps(_mm512_loadu_ps(p.add(i)), m[0]);
                i += 16;
            }
            let rest = s.len() - n16;
            if rest > 0 {
                let k = ((1u32 << rest) - 1) as __mmask16;
                m[1] = _mm512_mask_max_ps(m[1], k, _mm512_maskz_loadu_ps(k, p.add(n16)), m[1]);
            }
            let a = _mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]));
            _mm512_reduce_max_ps(a)
        }
    }

    /// `x ← x · s` for every element (one rounding each, as the scalar loop).
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn scale16(x: &mut [f32], s: f32) {
        let n16 = x.len() / 16 * 16;
        // SAFETY: 16-wide accesses at i..i+16 ≤ n16 ≤ x.len().
        unsafe {
            let sv = _mm512_set1_ps(s);
            let p = x.as_mut_ptr();
            let mut i = 0;
            while i < n16 {
                _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), sv));
                i += 16;
            }
        }
        x[n16..].iter_mut().for_each(|v| *v *= s);
    }

    /// [`exp8`] on 16 lanes: the same operations lane by lane.
    #[inline(always)]
    unsafe fn exp16(x: __m512) -> __m512 {
        // SAFETY: register-only AVX-512F ops in an AVX-512F caller.
        unsafe {
            let x = _mm512_max_ps(
                _mm512_min_ps(x, _mm512_set1_ps(88.0)),
                _mm512_set1_ps(-87.3),
            );
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
            let mut p = _mm512_set1_ps(1.987_569_1e-4);
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_2e-3));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
            p = _mm512_fmadd_ps(
                p,
                _mm512_mul_ps(r, r),
                _mm512_add_ps(r, _mm512_set1_ps(1.0)),
            );
            let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_cvtps_epi32(n),
                _mm512_set1_epi32(127),
            ));
            _mm512_mul_ps(p, _mm512_castsi512_ps(e))
        }
    }

    /// [`exp_sub_sum`] bit for bit, 16 exponentials at a time: the 8-lane sum takes the low
    /// then the high half of each, the chunks in the same order.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn exp_sub_sum16(s: &mut [f32], max: f32) -> f32 {
        let n8 = s.len() / 8 * 8;
        let n16 = s.len() / 16 * 16;
        // SAFETY: 16-wide accesses at i..i+16 ≤ n16, 8-wide at i..i+8 ≤ n8 ≤ s.len().
        let mut sum = unsafe {
            let m = _mm512_set1_ps(max);
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < n16 {
                let p = s.as_mut_ptr().add(i);
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p), m));
                _mm512_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
                acc = _mm256_add_ps(
                    acc,
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e))),
                );
                i += 16;
            }
            if i < n8 {
                let p = s.as_mut_ptr().add(i);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), _mm512_castps512_ps256(m)));
                _mm256_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, e);
            }
            hsum(acc)
        };
        for x in &mut s[n8..] {
            *x = (*x - max).exp();
            sum += *x;
        }
        sum
    }

    /// x ← exp(x − max) in place; returns Σ.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_sub_sum(s: &mut [f32], max: f32) -> f32 {
        let n8 = s.len() / 8 * 8;
        // SAFETY: 8-wide accesses at i..i+8 ≤ n8 ≤ s.len().
        let mut sum = unsafe {
            let m = _mm256_set1_ps(max);
            let mut acc = _mm256_setzero_ps();
            let mut i = 0;
            while i < n8 {
                let p = s.as_mut_ptr().add(i);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), m));
                _mm256_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, e);
                i += 8;
            }
            hsum(acc)
        };
        for x in &mut s[n8..] {
            *x = (*x - max).exp();
            sum += *x;
        }
        sum
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quantdot::f32_to_f16;

    /// Deterministic pseudo-random values in [-amp, amp) (shared with `attn_prefill`'s tests).
    pub(crate) fn data(seed: u64, n: usize, amp: f32) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
            })
            .collect()
    }

    /// [`data`] rounded to f16 bits (a KV cache's contents).
    pub(crate) fn f16_data(seed: u64, n: usize, amp: f32) -> Vec<u16> {
        data(seed, n, amp)
            .iter()
            .map(|&x| crate::quantdot::f32_to_f16(x))
            .collect()
    }

    /// Straight f64 attention from the definition.
    fn naive(q: &[f32], k: &[u16], v: &[u16], sh: DecodeShape, n_kv: usize) -> Vec<f64> {
        let (hd, group) = (sh.head_dim, sh.n_head / sh.n_head_kv);
        let mut out = vec![0f64; sh.n_head * hd];
        for h in 0..sh.n_head {
            let kvh = h / group;
            let sc: Vec<f64> = (0..n_kv)
                .map(|p| {
                    (0..hd)
                        .map(|i| q[h * hd + i] as f64 * f16_to_f32(k[sh.offset(p, kvh) + i]) as f64)
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for p in 0..n_kv {
                for i in 0..hd {
                    out[h * hd + i] += e[p] / z * f16_to_f32(v[sh.offset(p, kvh) + i]) as f64;
                }
            }
        }
        out
    }

    #[test]
    fn simd_and_scalar_match_definition() {
        let pool = ThreadPool::new(2);
        for (n_head, n_head_kv, hd, n_ctx, n_kv, amp) in [
            (4, 4, 8, 5, 1, 1.0),
            (9, 3, 64, 40, 37, 1.0),
            (24, 8, 128, 300, 257, 3.0),
            (6, 2, 20, 17, 17, 0.5), // head_dim not a multiple of 8
            (8, 1, 64, 64, 63, 8.0), // MQA, peaky softmax
        ] {
            for layout in [KvLayout::PosMajor, KvLayout::HeadMajor { n_ctx }] {
                let sh = DecodeShape {
                    n_head,
                    n_head_kv,
                    head_dim: hd,
                    layout,
                };
                let q = data(1 + n_kv as u64, n_head * hd, amp);
                let k: Vec<u16> = data(2, n_ctx * n_head_kv * hd, amp)
                    .into_iter()
                    .map(f32_to_f16)
                    .collect();
                let v: Vec<u16> = data(3, n_ctx * n_head_kv * hd, 1.0)
                    .into_iter()
                    .map(f32_to_f16)
                    .collect();
                let want = naive(&q, &k, &v, sh, n_kv);
                let mut s = vec![0f32; n_head * hd];
                attn_decode_f16_scalar(&q, &k, &v, sh, n_kv, &mut s).expect("scalar");
                let mut f = vec![0f32; n_head * hd];
                attn_decode_f16(&q, &k, &v, sh, n_kv, &mut f, Some(&pool)).expect("fast");
                for i in 0..want.len() {
                    assert!(
                        (s[i] as f64 - want[i]).abs() < 1e-4,
                        "scalar {i}: {} vs {}",
                        s[i],
                        want[i]
                    );
                    assert!(
                        (f[i] as f64 - want[i]).abs() < 1e-4,
                        "fast {i}: {} vs {}",
                        f[i],
                        want[i]
                    );
                    assert!(
                        (f[i] - s[i]).abs() < 2e-5 * (1.0 + s[i].abs()),
                        "twin {i}: {} vs {}",
                        f[i],
                        s[i]
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let sh = DecodeShape {
            n_head: 3,
            n_head_kv: 2,
            head_dim: 4,
            layout: KvLayout::PosMajor,
        };
        let mut o = vec![0f32; 12];
        assert!(attn_decode_f16(&[0.0; 12], &[0; 8], &[0; 8], sh, 1, &mut o, None).is_err());
        let sh = DecodeShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            layout: KvLayout::PosMajor,
        };
        let mut o = vec![0f32; 8];
        assert!(attn_decode_f16(&[0.0; 8], &[0; 4], &[0; 4], sh, 2, &mut o, None).is_err());
        assert!(attn_decode_f16(&[0.0; 8], &[0; 4], &[0; 4], sh, 0, &mut o, None).is_err());
        assert!(attn_decode_f16(&[0.0; 8], &[0; 4], &[0; 4], sh, 1, &mut o, None).is_ok());
        let sh = DecodeShape {
            layout: KvLayout::HeadMajor { n_ctx: 1 },
            ..sh
        };
        assert!(attn_decode_f16(&[0.0; 8], &[0; 4], &[0; 4], sh, 2, &mut o, None).is_err());
    }

    /// The AVX-512 softmax gives the AVX2 one's bits on every length (16-lane chunks, an
    /// 8-lane chunk, the scalar tail) and on values under the exponential's clamp.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn softmax_avx512_equals_avx2_bitwise() {
        if !(crate::quantdot::Isa::Avx512.is_available()) {
            return;
        }
        for n in (1..70).chain([255, 256, 1023]) {
            for amp in [1.0f32, 30.0, 200.0] {
                let x = data(n as u64 + 5, n, amp);
                let (mut a, mut b) = (x.clone(), x);
                softmax(true, &mut a);
                // SAFETY: AVX-512F (and with it AVX2/FMA/F16C on every CPU that has it) was
                // detected above.
                unsafe { softmax_avx512(&mut b) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "n {n} amp {amp}");
            }
        }
    }
}
