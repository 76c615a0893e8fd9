//! Our own small, seedable PRNG: xoshiro256** seeded through splitmix64.
//!
//! No `rand` dependency: the same seed must give the same token stream on every platform and
//! every build, so the generator is part of our code. Quality is more than enough for sampling.

use std::time::{SystemTime, UNIX_EPOCH};

/// llama.cpp's `LLAMA_DEFAULT_SEED` (0xFFFF_FFFF): a seed with this value means "pick a random
/// seed", exactly like llama.cpp. `SamplerConfig::seed = None` means the same.
pub const DEFAULT_SEED: u64 = 0xFFFF_FFFF;

/// One step of splitmix64: advances `state` and returns a well-mixed 64-bit value.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Resolves a user seed: `None` or [`DEFAULT_SEED`] become a seed derived from the system clock
/// (nanoseconds) and the process id, mirroring llama.cpp's `get_rng_seed`. Any other value is
/// returned unchanged. The resolved seed is what the chain reports, so a random run can be
/// replayed by passing it back explicitly.
pub fn resolve_seed(seed: Option<u64>) -> u64 {
    match seed {
        Some(s) if s != DEFAULT_SEED => s,
        _ => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let mut st = nanos ^ (u64::from(std::process::id()) << 32);
            // Keep it in u32 range like llama.cpp so it can be printed and passed back; avoid
            // landing on the sentinel itself.
            let s = splitmix64(&mut st) & 0xFFFF_FFFF;
            if s == DEFAULT_SEED { 0 } else { s }
        }
    }
}

/// xoshiro256** generator.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4], // generator state, never all zero
}

impl Rng {
    /// Creates a generator from a 64-bit seed (state filled by splitmix64).
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        // splitmix64 of consecutive states cannot yield four zeros, but be explicit.
        let s = if s == [0; 4] { [1, 0, 0, 0] } else { s };
        Self { s }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f32` in `[0, 1)` (24 random bits).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform integer in `[0, n)`; `n` must be > 0 (returns 0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift; the tiny bias is irrelevant for tests and sampling.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = Rng::new(43);
        assert_ne!(Rng::new(42).next_u64(), c.next_u64());
    }

    #[test]
    fn floats_in_unit_interval() {
        let mut r = Rng::new(7);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            let y = r.next_f32();
            assert!((0.0..1.0).contains(&y));
            sum += x;
        }
        let mean = sum / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn resolve_seed_keeps_explicit_seeds() {
        assert_eq!(resolve_seed(Some(1234)), 1234);
        assert_eq!(resolve_seed(Some(0)), 0);
        assert_ne!(resolve_seed(None), DEFAULT_SEED);
        assert_ne!(resolve_seed(Some(DEFAULT_SEED)), DEFAULT_SEED);
    }
}
