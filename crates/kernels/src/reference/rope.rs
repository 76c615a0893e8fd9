//! Rotary position embeddings (RoPE) in both pair layouts, with llama3 frequency scaling.
//!
//! For pair `i` of a head (`i < n_rot / 2`) at position `p` the rotation angle is
//! `θ = p · inv_freq[i]` with `inv_freq[i] = base^(−2i / n_rot) / freq_factor[i]`
//! (ggml divides θ by the factor read from `rope_freqs.weight`; HF multiplies `inv_freq` by its
//! reciprocal: the same thing). Dimensions `n_rot..head_dim` of a head are left untouched.

/// Which two elements of a head form a rotary pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(x[2i], x[2i + 1])`: ggml rope mode 0, what GGUF llama models use
    /// (llama.cpp's converter permutes the Q/K weights into this layout).
    Normal,
    /// Halves `(x[i], x[i + n_rot / 2])`: ggml `NEOX` mode, Hugging Face's `rotate_half` on
    /// un-permuted weights.
    Neox,
}

/// Llama 3 frequency-scaling parameters (`rope_scaling.rope_type = "llama3"` in HF configs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScalingLlama3 {
    /// Overall context-extension factor (32 for Llama 3.2, 8 for 3.1).
    pub factor: f32,
    /// Wavelengths longer than `original_ctx / low_freq_factor` are divided by `factor`.
    pub low_freq_factor: f32,
    /// Wavelengths shorter than `original_ctx / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The pre-extension training context (8192 for Llama 3).
    pub original_ctx: f32,
}

/// Per-pair inverse frequencies `[n_rot / 2]`: `base^(−2i / n_rot) / freq_factors[i]`.
///
/// `freq_factors` (from `rope_freqs.weight` or [`llama3_freq_factors`]) must have `n_rot / 2`
/// entries when given.
pub fn rope_inv_freq(n_rot: usize, base: f32, freq_factors: Option<&[f32]>) -> Vec<f32> {
    let half = n_rot / 2;
    if let Some(ff) = freq_factors {
        assert_eq!(
            ff.len(),
            half,
            "rope_inv_freq: need {half} frequency factors"
        );
    }
    (0..half)
        .map(|i| {
            let inv = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
            let ff = freq_factors.map_or(1.0, |ff| f64::from(ff[i]));
            (inv / ff) as f32
        })
        .collect()
}

/// The llama3 frequency factors `[n_rot / 2]` that ggml stores as `rope_freqs.weight`:
/// 1 for short wavelengths, `factor` for long ones, and a smooth blend in between.
pub fn llama3_freq_factors(n_rot: usize, base: f32, s: &RopeScalingLlama3) -> Vec<f32> {
    let low_wavelen = f64::from(s.original_ctx) / f64::from(s.low_freq_factor);
    let high_wavelen = f64::from(s.original_ctx) / f64::from(s.high_freq_factor);
    (0..n_rot / 2)
        .map(|i| {
            let inv = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
            let wavelen = 2.0 * std::f64::consts::PI / inv;
            let factor = f64::from(s.factor);
            let ff = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (f64::from(s.original_ctx) / wavelen - f64::from(s.low_freq_factor))
                    / f64::from(s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            ff as f32
        })
        .collect()
}

/// Rotates the first `n_rot` dimensions of every head, in place.
///
/// * `x`: `[n_tokens, n_head, head_dim]` f32; token `t` sits at position `pos0 + t`
/// * `inv_freq`: `[n_rot / 2]` f32 from [`rope_inv_freq`]
pub fn rope(
    x: &mut [f32],
    n_head: usize,
    head_dim: usize,
    pos0: usize,
    inv_freq: &[f32],
    layout: RopeLayout,
) {
    let half = inv_freq.len();
    let n_rot = 2 * half;
    assert!(
        n_rot <= head_dim,
        "rope: n_rot {n_rot} exceeds head_dim {head_dim}"
    );
    let width = n_head * head_dim;
    assert!(
        width > 0 && x.len().is_multiple_of(width),
        "rope: x is not [n_tokens, {n_head}, {head_dim}]"
    );
    // [half] (sin, cos) of the current token, shared by its heads.
    let mut sc = vec![(0f32, 0f32); half];
    for (t, row) in x.chunks_exact_mut(width).enumerate() {
        rope_angles(pos0 + t, inv_freq, &mut sc);
        rope_rotate(row, head_dim, &sc, layout);
    }
}

/// The `(sin, cos)` of every rotary pair at position `pos`, `sc`: `[inv_freq.len()]`: what
/// [`rope`] computes once per token (a caller rotating Q and K of one token shares them).
pub fn rope_angles(pos: usize, inv_freq: &[f32], sc: &mut [(f32, f32)]) {
    let pos = pos as f64;
    for (v, &f) in sc.iter_mut().zip(inv_freq) {
        // Angle in f64 so large positions keep their precision.
        let theta = pos * f64::from(f);
        *v = (theta.sin() as f32, theta.cos() as f32);
    }
}

/// Rotates every head of one token (`row`: `[n_head, head_dim]` f32) by the angles `sc`
/// (`[n_rot / 2]`, from [`rope_angles`]), exactly as [`rope`] does.
pub fn rope_rotate(row: &mut [f32], head_dim: usize, sc: &[(f32, f32)], layout: RopeLayout) {
    let half = sc.len();
    for head in row.chunks_exact_mut(head_dim) {
        for (i, &(sin, cos)) in sc.iter().enumerate() {
            let (a, b) = match layout {
                RopeLayout::Normal => (2 * i, 2 * i + 1),
                RopeLayout::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}
