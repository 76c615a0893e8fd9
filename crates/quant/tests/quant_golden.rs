//! Quantization must be bit-identical with llama.cpp's reference quantizers.
//!
//! Fixture `tests/fixtures/quant_golden.txt` is produced by `tools/quant_ref_golden.c` linked
//! against llama.cpp's libggml-base (`ggml_quantize_chunk` with no importance matrix, i.e. the
//! `quantize_row_*_ref` path of `llama-quantize`). Inputs are regenerated here by [`gen_row`],
//! a line-by-line mirror of the C generator (splitmix64 + exactly rounded f32 steps), so the
//! fixture only carries FNV-1a digests of the outputs (per case, and over 200 mixed rows per
//! type) plus the full output of case 0.

use damascus_quant::{GgmlType, quantize_row};

const FIXTURE: &str = include_str!("fixtures/quant_golden.txt");
const TYPES: [&str; 14] = [
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "Q8_K",
];
const N_CASES: u64 = 20;

/// What each generator case exercises (index = case number).
const CASE_NAMES: [&str; N_CASES as usize] = [
    "typical",
    "zero",
    "const+",
    "const-",
    "huge",
    "tiny",
    "subnormal",
    "outliers",
    "neg-only",
    "pos-only",
    "int-grid",
    "ties",
    "zero-groups",
    "alternating",
    "ramp",
    "heavy-tail",
    "overflow",
    "inf",
    "nan",
    "any-bits",
];

/// splitmix64, as in the C generator.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * f32::from_bits(0x3380_0000) // 2^-24
    }
    fn normalish(&mut self) -> f32 {
        let mut s = self.uniform();
        s += self.uniform();
        s += self.uniform();
        s += self.uniform();
        s -= 2.0;
        s * 1.732_050_8
    }
}

/// Mirror of `gen_row` in tools/quant_ref_golden.c.
fn gen_row(kase: u64, rng: &mut Rng, x: &mut [f32]) {
    for (i, o) in x.iter_mut().enumerate() {
        *o = match kase {
            0 => rng.normalish() * 0.02,
            1 => 0.0,
            2 => 0.5,
            3 => -0.25,
            4 => rng.normalish() * 1e18,
            5 => rng.normalish() * 1e-20,
            6 => rng.normalish() * 1e-39,
            7 => {
                if i % 97 == 13 {
                    3.0
                } else {
                    rng.normalish() * 0.02
                }
            }
            8 => -rng.normalish().abs() * 0.1,
            9 => rng.normalish().abs(),
            10 => (rng.next_u64() % 17) as i32 as f32 - 8.0,
            11 => ((rng.next_u64() % 33) as i32 as f32 - 16.0) * 0.5,
            12 => {
                if (i / 16) % 3 == 0 {
                    0.0
                } else {
                    rng.normalish() * 0.02
                }
            }
            13 => {
                if i % 2 == 1 {
                    0.75
                } else {
                    -0.75
                }
            }
            14 => i as f32 * 0.001 - 0.1,
            15 => {
                let n = rng.normalish();
                n * if rng.uniform() < 0.05 { 0.5 } else { 0.01 }
            }
            16 => rng.normalish() * 1e30,
            17 => {
                if i == 5 {
                    f32::INFINITY
                } else {
                    rng.normalish() * 0.02
                }
            }
            18 => {
                if i == 9 {
                    f32::NAN
                } else {
                    rng.normalish() * 0.02
                }
            }
            _ => {
                let mut b = rng.next_u64() as u32;
                if b & 0x7f80_0000 == 0x7f80_0000 {
                    b &= 0xff80_0000; // NaN -> +-Inf, see the C generator
                }
                f32::from_bits(b)
            }
        };
    }
}

/// FNV-1a 64-bit offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Continues an FNV-1a 64-bit hash over `bytes`.
fn fnv1a_update(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn quantize_matches_llama_cpp_reference() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in FIXTURE.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let ti = TYPES.iter().position(|t| *t == f[0]).expect("known type") as u64;
        let dtype = GgmlType::from_name(f[0]).unwrap();
        let n = 1024;
        let mut x = vec![0f32; n]; // [n] f32 input row
        let mut out = vec![0u8; dtype.row_bytes(n as u64).unwrap() as usize];
        match f[1] {
            "bulk" => {
                let rows: u64 = f[2].parse().unwrap();
                let mut h = FNV_OFFSET;
                for r in 0..rows {
                    let mut rng = Rng(0xB01C * 1_000_003 + ti * 7919 + r);
                    gen_row(r % N_CASES, &mut rng, &mut x);
                    quantize_row(dtype, &x, &mut out).unwrap();
                    h = fnv1a_update(h, &out);
                }
                if h != u64::from_str_radix(f[3], 16).unwrap() {
                    failures.push(format!("{} bulk ({rows} mixed rows)", f[0]));
                }
            }
            "full" => {
                let mut rng = Rng(0x5EED * 1_000_003 + ti * 7919);
                gen_row(0, &mut rng, &mut x);
                quantize_row(dtype, &x, &mut out).unwrap();
                if hex(&out) != f[2] {
                    failures.push(format!("{} full output of case 0 differs", f[0]));
                }
            }
            case => {
                let kase: u64 = case.parse().unwrap();
                let mut rng = Rng(0x5EED * 1_000_003 + ti * 7919 + kase);
                gen_row(kase, &mut rng, &mut x);
                quantize_row(dtype, &x, &mut out).unwrap();
                if fnv1a_update(FNV_OFFSET, &out) != u64::from_str_radix(f[3], 16).unwrap() {
                    failures.push(format!(
                        "{} case {kase} ({})",
                        f[0], CASE_NAMES[kase as usize]
                    ));
                }
            }
        }
        checked += 1;
    }
    assert_eq!(checked, TYPES.len() * (N_CASES as usize + 2));
    assert!(
        failures.is_empty(),
        "mismatches vs llama.cpp:\n{}",
        failures.join("\n")
    );
}
