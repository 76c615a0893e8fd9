//! A bounded random-mutation fuzz loop over the same harness as the `cargo fuzz` target
//! (`fuzz/fuzz_targets/parse.rs`), so stable CI exercises it too. Seeds: the synthetic file and
//! small hand-built headers; mutations: byte flips, insertions, deletions, splices, and
//! overwriting little-endian integers with boundary values.

mod common;

use std::time::{Duration, Instant};

use common::{Raw, synthetic_bytes};
use damascus_gguf::fuzz_harness;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: [u64; 10] = [0, 1, 2, 31, 32, 255, 1 << 31, 1 << 60, 1 << 62, u64::MAX];

fn mutate(rng: &mut Rng, b: &mut Vec<u8>, seeds: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(b.len() + 1);
                b.insert(i, rng.next() as u8);
            }
            3 if !b.is_empty() => {
                let i = rng.below(b.len());
                let n = rng.below(16).min(b.len() - i);
                b.drain(i..i + n);
            }
            4 if b.len() >= 8 => {
                let i = rng.below(b.len() - 7);
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1usize, 4, 8][rng.below(3)];
                b[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
            _ => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() && !b.is_empty() {
                    let (i, j) = (rng.below(b.len()), rng.below(other.len()));
                    let n = rng.below(64).min(b.len() - i).min(other.len() - j);
                    b[i..i + n].copy_from_slice(&other[j..j + n]);
                }
            }
        }
    }
}

#[test]
fn bounded_mutation_fuzz() {
    let mut seeds = vec![synthetic_bytes()];
    let mut r = Raw::header(3, 2, 2);
    r.kv_u32("general.alignment", 32)
        .str("a")
        .u32(9)
        .u32(9)
        .u64(1)
        .u32(8)
        .u64(1)
        .str("x");
    r.tensor("t", &[32, 2], 2, 0)
        .tensor("u", &[4], 0, 64)
        .pad(32)
        .zeros(96);
    seeds.push(r.build());
    seeds.push(Raw::header(2, 0, 0).build());
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    if let Ok(entries) = std::fs::read_dir(fixtures) {
        for e in entries.flatten() {
            // Regression inputs found by `cargo fuzz` run through the harness as-is first.
            let bytes = std::fs::read(e.path()).unwrap();
            let t = Instant::now();
            fuzz_harness(&bytes);
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{}",
                e.path().display()
            );
            seeds.push(bytes);
        }
    }
    // DAMASCUS_FUZZ_SECS=180 runs a longer session locally.
    let secs: u64 = std::env::var("DAMASCUS_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut runs = 0u64;
    let mut corpus = seeds.clone();
    while Instant::now() < deadline {
        let mut b = corpus[rng.below(corpus.len())].clone();
        mutate(&mut rng, &mut b, &seeds);
        let t = Instant::now();
        fuzz_harness(&b);
        assert!(t.elapsed() < Duration::from_millis(500), "slow input");
        // Keep some still-parseable mutants as new seeds (cheap coverage stand-in).
        if corpus.len() < 256 && damascus_gguf::GgufFile::from_bytes(b.clone()).is_ok() {
            corpus.push(b);
        }
        runs += 1;
    }
    eprintln!(
        "bounded_mutation_fuzz: {runs} runs, corpus {}",
        corpus.len()
    );
    assert!(runs > 100);
}
