//! Forward-pass fixtures on models our own tools generate, so they need no download beyond the
//! default model and the Llama 3 tokenizer:
//!
//! * the default SmolLM2 requantized to Q4_K_M by `damascus quantize` (576 is not a multiple
//!   of 256, so it mixes Q5_0, Q8_0 and Q6_K fallbacks with Q4_K);
//! * the `tiny-llama3` synthetic model in Q4_K_M from `damascus synth` (Q4_K + Q6_K, llama3
//!   rope scaling via `rope_freqs.weight`, tied 128k embeddings).
//!
//! Each generated file is checked against the SHA-256 recorded in its fixture first: if our
//! quantizer or synthesizer changes its output, the fixture must be regenerated with
//! `tools/hf_fixtures.py`, and the test says so instead of reporting a forward-pass error.

use std::path::{Path, PathBuf};

use damascus_convert::{
    NoProgress, QuantizeOptions, Shape, SynthOptions, quantize_file, synth_model,
};
use damascus_model::verify::{Fixture, Tolerance, verify};
use damascus_model::{LoadOptions, Model};
use damascus_quant::recipe::{Mix, RecipeOptions};
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/forward")
        .join(name);
    Fixture::load(path).expect("reading the fixture")
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("reading the generated model");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A scratch path for a generated model, reused across runs while its hash still matches.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("damascus-test-models");
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir.join(name)
}

fn generate_once(path: &Path, want_sha: &str, generate: impl FnOnce(&Path)) {
    if path.exists() && sha256(path) == want_sha {
        return;
    }
    let _ = std::fs::remove_file(path);
    generate(path);
    let got = sha256(path);
    assert_eq!(
        got,
        want_sha,
        "{} differs from the file the fixture was made from: regenerate the fixture with \
         tools/hf_fixtures.py",
        path.display()
    );
}

fn check(model_path: &Path, fixture: &Fixture) {
    let model = Model::load(
        model_path,
        &LoadOptions {
            n_ctx: Some(64),
            // These fixtures hold the reference path to the reference tolerance.
            backend: damascus_model::BackendKind::Reference,
            ..Default::default()
        },
    )
    .expect("loading the generated model");
    let report = verify(&model, fixture).expect("running the fixture");
    for s in &report.slots {
        eprintln!(
            "{:<12} cosine {:.7} max|Δ| {:.3e}",
            s.label, s.cosine, s.max_abs
        );
    }
    eprintln!("top-5 {:?}", report.top5);
    let tol = Tolerance::REFERENCE;
    assert!(
        report.passed(&tol),
        "diverges: {:?}, top-1 {} vs {}, top-5 Δp {}",
        report.first_divergence(&tol),
        report.top1,
        report.top1_hf,
        report.max_top5_diff()
    );
}

#[test]
fn smollm2_requantized_q4_k_m_matches_hf() {
    let fx = fixture("smollm2-requant-q4_k_m.json");
    let want = fx
        .meta
        .model_sha256
        .clone()
        .expect("fixture without model_sha256");
    let path = scratch("SmolLM2-135M-Instruct.requant.Q4_K_M.gguf");
    generate_once(&path, &want, |out| {
        let input = damascus_hub::default_model_path().expect("fetching the default model");
        let opts = QuantizeOptions {
            mix: Mix::Q4_K_M,
            allow_requantize: true,
            threads: damascus_convert::default_threads(),
            recipe: RecipeOptions::default(),
        };
        quantize_file(&input, out, &opts, &NoProgress).expect("quantizing");
    });
    check(&path, &fx);
}

#[test]
fn tiny_llama3_q4_k_m_matches_hf() {
    let fx = fixture("tiny-llama3-q4_k_m.json");
    let want = fx
        .meta
        .model_sha256
        .clone()
        .expect("fixture without model_sha256");
    let path = scratch("tiny-llama3.Q4_K_M.gguf");
    generate_once(&path, &want, |out| {
        let tokenizer =
            damascus_hub::llama3_tokenizer_json().expect("fetching the Llama 3 tokenizer");
        let opts = SynthOptions {
            shape: Shape::by_name("tiny-llama3").expect("tiny-llama3 shape"),
            mix: Mix::Q4_K_M,
            seed: damascus_convert::DEFAULT_SEED,
            tokenizer: &tokenizer,
            threads: damascus_convert::default_threads(),
        };
        synth_model(&opts, out, &NoProgress).expect("synthesizing");
    });
    check(&path, &fx);
}

#[test]
fn llama3_factors_match_the_synthetic_rope_freqs_tensor() {
    // Our llama3 formula (used when only metadata declares the scaling) reproduces the
    // `rope_freqs.weight` that ggml-style files carry.
    let path = scratch("tiny-llama3.Q4_K_M.gguf");
    if !path.exists() {
        eprintln!(
            "skipped: {} not generated yet (tiny_llama3_q4_k_m_matches_hf makes it)",
            path.display()
        );
        return;
    }
    let file = damascus_gguf::GgufFile::open(&path).unwrap();
    let info = file.tensor("rope_freqs.weight").expect("rope_freqs.weight");
    let stored: Vec<f32> = file
        .tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let s = damascus_kernels::reference::RopeScalingLlama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_ctx: 8192.0,
    };
    let ours = damascus_kernels::reference::llama3_freq_factors(stored.len() * 2, 500_000.0, &s);
    for (i, (a, b)) in ours.iter().zip(&stored).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "factor {i}: ours {a} vs file {b}"
        );
    }
}
