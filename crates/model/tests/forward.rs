//! End-to-end forward-pass tests on the default model (SmolLM2-135M-Instruct Q4_1):
//! agreement with the Hugging Face fixtures, prefill vs decode consistency, context limits.
//!
//! The model comes from `damascus_hub::default_model_path()`; if it cannot be fetched the
//! tests fail loudly (CI fetches it). The synthetic 3B test runs only when
//! `DAMASCUS_TEST_3B=<path to the damascus synth Q4_K_M GGUF>` is set.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use damascus_model::verify::{Fixture, Tolerance, verify};
use damascus_model::{LoadOptions, Model, ModelError};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/forward")
}

/// The default model, loaded once for every test in this file.
fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = damascus_hub::default_model_path()
            .expect("the default model (SmolLM2-135M-Instruct Q4_1) could not be fetched");
        Model::load(
            &path,
            &LoadOptions {
                n_ctx: Some(64),
                // These fixtures hold the reference path to the reference tolerance.
                backend: damascus_model::BackendKind::Reference,
                ..Default::default()
            },
        )
        .expect("loading the default model")
    })
}

fn check_fixture(name: &str) {
    let fixture = Fixture::load(fixture_dir().join(name)).expect("reading the fixture");
    let report = verify(model(), &fixture).expect("running the fixture");
    let tol = Tolerance::REFERENCE;
    for s in &report.slots {
        eprintln!(
            "{:<12} cosine {:.7} max|Δ| {:.3e}",
            s.label, s.cosine, s.max_abs
        );
    }
    eprintln!("top-5 {:?}", report.top5);
    assert!(
        report.first_divergence(&tol).is_none(),
        "{name}: diverges at {:?}",
        report.first_divergence(&tol)
    );
    assert_eq!(report.top1, report.top1_hf, "{name}: top-1 differs");
    assert!(
        report.max_top5_diff() <= tol.max_top5_prob_diff,
        "{name}: top-5 Δp {}",
        report.max_top5_diff()
    );
    assert!(report.passed(&tol));
}

#[test]
fn matches_hf_capital_of_france() {
    check_fixture("smollm2-q4_1.json");
}

#[test]
fn matches_hf_chat_prompt() {
    check_fixture("smollm2-q4_1-long.json");
}

/// Softmax probabilities in f64.
fn probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

#[test]
fn paris_is_first_at_77_percent() {
    // "The capital of France is" in the SmolLM2 vocabulary; " Paris" is 7042.
    let mut s = model().session().unwrap();
    let p = probs(&s.eval(&[504, 3575, 282, 4649, 314]).unwrap());
    let best = (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
    assert_eq!(best, 7042);
    assert!((p[7042] - 0.7725).abs() < 0.005, "p(Paris) = {}", p[7042]);
}

#[test]
fn prefill_equals_token_by_token_decode() {
    let ids = [504u32, 3575, 282, 4649, 314, 7042, 30];
    let mut a = model().session().unwrap();
    let prefill = a.eval(&ids).unwrap();
    let mut b = model().session().unwrap();
    let mut decode = Vec::new();
    for &id in &ids {
        decode = b.eval(&[id]).unwrap();
    }
    assert_eq!(a.n_past(), ids.len());
    assert_eq!(b.n_past(), ids.len());
    let max_diff = prefill
        .iter()
        .zip(&decode)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        max_diff < 1e-3,
        "prefill vs decode logits differ by {max_diff}"
    );

    // Split prefill (3 + 4) and truncate-then-replay give the same result too.
    let mut c = model().session().unwrap();
    c.eval(&ids[..3]).unwrap();
    c.eval(&[1, 2]).unwrap();
    c.truncate(3);
    assert_eq!(c.n_past(), 3);
    let split = c.eval(&ids[3..]).unwrap();
    let max_diff = prefill
        .iter()
        .zip(&split)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "split prefill differs by {max_diff}");
    c.reset();
    assert_eq!(c.n_past(), 0);
}

#[test]
fn running_past_the_context_is_an_error() {
    assert_eq!(model().session().unwrap().n_ctx(), 64);
    let mut s = model().session_with_n_ctx(8).unwrap();
    assert_eq!(s.n_ctx(), 8);
    assert!(matches!(s.eval(&[]), Err(ModelError::EmptyInput)));
    assert!(matches!(
        s.eval(&[u32::MAX]),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    s.eval(&[1; 6]).unwrap();
    let err = s.eval(&[1; 3]).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextFull {
                n_ctx: 8,
                n_past: 6,
                n_tokens: 3
            }
        ),
        "{err}"
    );
    assert_eq!(s.n_past(), 6, "a failed eval must not advance");
    s.eval(&[1; 2]).unwrap();
    assert!(matches!(s.eval(&[1]), Err(ModelError::ContextFull { .. })));
    assert!(model().session_with_n_ctx(0).is_err());
}

/// The synthetic Llama-3.2-3B Q4_K_M (llama3 rope scaling, tied 128k embeddings); slow on the
/// scalar path, so opt-in: `DAMASCUS_TEST_3B=/path/to/model.gguf cargo test -p damascus-model`.
/// With `DAMASCUS_TEST_3B_FIXTURE=<fixture.json>` it is also checked against HF.
#[test]
fn synthetic_3b_when_requested() {
    let Some(path) = std::env::var_os("DAMASCUS_TEST_3B") else {
        eprintln!("skipped: set DAMASCUS_TEST_3B to run");
        return;
    };
    let model = Model::load(
        &path,
        &LoadOptions {
            n_ctx: Some(32),
            ..Default::default()
        },
    )
    .unwrap();
    let p = model.params();
    assert!(p.n_head > p.n_head_kv, "expected GQA");
    if let Some(fx) = std::env::var_os("DAMASCUS_TEST_3B_FIXTURE") {
        let fixture = Fixture::load(fx).unwrap();
        let report = verify(&model, &fixture).unwrap();
        assert!(report.passed(&Tolerance::REFERENCE), "{report:?}");
    }
    let mut a = model.session().unwrap();
    let prefill = a.eval(&[1, 2, 3]).unwrap();
    let mut b = model.session().unwrap();
    b.eval(&[1, 2]).unwrap();
    let decode = b.eval(&[3]).unwrap();
    let max_diff = prefill
        .iter()
        .zip(&decode)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 1e-2, "prefill vs decode differ by {max_diff}");
}

#[test]
fn backend_comparison_harness_sees_identical_models() {
    // The harness later backends are checked with: the reference against itself is exact.
    let path = damascus_hub::default_model_path().unwrap();
    let file = std::sync::Arc::new(damascus_gguf::GgufFile::open(&path).unwrap());
    let opts = LoadOptions {
        n_ctx: Some(8),
        ..Default::default()
    };
    let other = Model::with_backend(
        file,
        &opts,
        damascus_model::backend::reference::ReferenceBackend,
    )
    .unwrap();
    let diff = damascus_model::verify::compare_models(model(), &other, &[504, 3575, 282]).unwrap();
    assert_eq!(diff.slots.len(), model().params().n_layer + 2);
    assert!(
        diff.slots
            .iter()
            .all(|s| s.max_abs == 0.0 && s.cosine > 0.999_999)
    );
    assert_eq!(diff.logits_max_abs, 0.0);
    assert!(diff.same_top1);
}
