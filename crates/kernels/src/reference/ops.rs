//! Row-wise and element-wise ops: RMSNorm, softmax, SiLU, SwiGLU, GELU (tanh), GeGLU, residual
//! and bias adds, scaling, soft-capping.

/// RMSNorm of every row, scaled by a learned weight:
/// `y[t, i] = x[t, i] / sqrt(mean(x[t]²) + eps) * w[i]`.
///
/// * `x`: `[n_tokens, n]` f32
/// * `w`: `[n]` f32
/// * `y`: `[n_tokens, n]` f32 (overwritten)
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "rms_norm: x is not [n_tokens, {n}]"
    );
    assert_eq!(x.len(), y.len(), "rms_norm: x and y differ in length");
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        // Sum of squares in f64: cheap here and removes accumulation order from the comparison.
        let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let scale = (1.0 / (ss / n as f64 + f64::from(eps)).sqrt()) as f32;
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = xv * scale * wv;
        }
    }
}

/// In-place numerically stable softmax of one row: `x[i] = exp(x[i] - max) / Σ exp(x[j] - max)`.
///
/// * `x`: `[n]` f32
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return; // empty, or everything masked: leave as is
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU (swish): `x · σ(x) = x / (1 + e^(−x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU, in place on the gate: `gate[i] = silu(gate[i]) * up[i]`.
///
/// * `gate`: `[n_tokens, n_ff]` f32 (overwritten with the result)
/// * `up`: `[n_tokens, n_ff]` f32
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// Residual add, in place: `x[i] += y[i]`.
///
/// * `x`, `y`: same shape, f32
pub fn add(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add: operands differ in length");
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// GELU with the tanh approximation (PyTorch's `gelu(approximate="tanh")`):
/// `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// GeGLU, in place on the gate: `gate[i] = gelu_tanh(gate[i]) * up[i]`.
///
/// * `gate`: `[n_tokens, n_ff]` f32 (overwritten with the result)
/// * `up`: `[n_tokens, n_ff]` f32
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "geglu: gate and up differ in length");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = gelu_tanh(*g) * u;
    }
}

/// Bias add on every row, in place: `x[t, i] += b[i]`.
///
/// * `x`: `[n_tokens, n]` f32
/// * `b`: `[n]` f32
pub fn add_bias(x: &mut [f32], b: &[f32]) {
    let n = b.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n),
        "add_bias: x is not [n_tokens, {n}]"
    );
    for row in x.chunks_exact_mut(n) {
        add(row, b);
    }
}

/// Soft-capping, in place: `x[i] = cap · tanh(x[i] / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}
