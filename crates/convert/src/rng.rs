//! Deterministic random numbers for synthetic weights: SplitMix64 streams and Box–Muller
//! normals.
//!
//! Every tensor row gets its own stream, keyed by (seed, tensor index, row), so the weights do
//! not depend on how rows are split across threads.

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny 64-bit generator with good statistical quality.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The stream for row `row` of tensor `tensor` under `seed`.
    pub fn for_row(seed: u64, tensor: u64, row: u64) -> Self {
        // Mix the three keys through the finalizer so neighbouring rows are unrelated.
        let k = mix(seed ^ mix(tensor.wrapping_add(0x9E37_79B9_7F4A_7C15)));
        SplitMix64::new(mix(k ^ row.wrapping_mul(0xD1B5_4A32_D192_ED03)))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// Fill `out` with N(mean, std²) samples (Box–Muller, both outputs of each pair used).
    ///
    /// Only IEEE f32 `+ - * /` and `sqrt` are used (our own `ln` and `sincos` polynomials, no
    /// platform libm), so the values are bit-identical on every platform.
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        let mut chunks = out.chunks_exact_mut(2);
        for pair in &mut chunks {
            let (z0, z1) = self.normal_pair();
            pair[0] = mean + std * z0;
            pair[1] = mean + std * z1;
        }
        if let [last] = chunks.into_remainder() {
            *last = mean + std * self.normal_pair().0;
        }
    }

    /// Two independent standard normal samples from one 64-bit draw.
    fn normal_pair(&mut self) -> (f32, f32) {
        let bits = self.next_u64();
        // u1 in (0, 1]: 24 bits; u2 in [0, 1): 24 other bits.
        let u1 = ((bits >> 40) + 1) as f32 * (1.0 / (1u32 << 24) as f32);
        let u2 = ((bits >> 8) & 0xFF_FFFF) as f32 * (1.0 / (1u32 << 24) as f32);
        let r = (-2.0 * ln(u1)).sqrt();
        let (s, c) = sincos_turns(u2);
        (r * c, r * s)
    }
}

/// Natural log of `x` in (0, 1], |error| < 1e-6: `x = m·2^e` with m in [√½, √2), then
/// `ln m = 2·atanh((m-1)/(m+1))` by its odd series.
fn ln(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xFF) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000); // [1, 2)
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let series =
        s * (2.0 + s2 * (2.0 / 3.0 + s2 * (2.0 / 5.0 + s2 * (2.0 / 7.0 + s2 * (2.0 / 9.0)))));
    e as f32 * std::f32::consts::LN_2 + series
}

/// `(sin 2πt, cos 2πt)` for t in [0, 1), |error| < 1e-6: reduce to an octant, then Taylor
/// polynomials on |θ| ≤ π/4.
fn sincos_turns(t: f32) -> (f32, f32) {
    // Quarter turns: q in 0..4, f in [-0.5, 0.5) quarter turns around it.
    let x = t * 4.0;
    let q = (x + 0.5) as i32; // round to nearest quarter (x >= 0)
    let f = x - q as f32;
    let th = f * std::f32::consts::FRAC_PI_2; // |th| <= π/4
    let t2 = th * th;
    let sin = th * (1.0 - t2 / 6.0 * (1.0 - t2 / 20.0 * (1.0 - t2 / 42.0 * (1.0 - t2 / 72.0))));
    let cos = 1.0 - t2 / 2.0 * (1.0 - t2 / 12.0 * (1.0 - t2 / 30.0 * (1.0 - t2 / 56.0)));
    match q & 3 {
        0 => (sin, cos),
        1 => (cos, -sin),
        2 => (-sin, -cos),
        _ => (-cos, sin),
    }
}

/// The SplitMix64 output finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (reference implementation).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn normal_statistics() {
        let mut r = SplitMix64::for_row(42, 3, 7);
        let mut v = vec![0f32; 200_001];
        r.fill_normal(&mut v, 0.0, 0.02);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 2e-4, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 2e-4, "std {}", var.sqrt());
        assert!(v.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn ln_and_sincos_are_accurate() {
        for k in 1..=10_000u32 {
            let x = k as f32 / 10_000.0;
            assert!(
                (f64::from(ln(x)) - f64::from(x).ln()).abs() < 2e-6,
                "ln {x}"
            );
            let (s, c) = sincos_turns(x - 1e-4);
            let th = std::f64::consts::TAU * f64::from(x - 1e-4);
            assert!((f64::from(s) - th.sin()).abs() < 2e-6, "sin {x}");
            assert!((f64::from(c) - th.cos()).abs() < 2e-6, "cos {x}");
        }
    }

    #[test]
    fn rows_are_independent_streams() {
        let a = SplitMix64::for_row(1, 0, 0).next_u64();
        let b = SplitMix64::for_row(1, 0, 1).next_u64();
        let c = SplitMix64::for_row(1, 1, 0).next_u64();
        let d = SplitMix64::for_row(2, 0, 0).next_u64();
        assert!(a != b && a != c && a != d && b != c);
        assert_eq!(a, SplitMix64::for_row(1, 0, 0).next_u64());
    }
}
