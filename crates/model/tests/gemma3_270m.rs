//! The real Gemma 3 270M (Q4_K_M, `damascus pull gemma3-270m`) against Hugging Face
//! transformers running the same GGUF dequantized to f32 (`tests/fixtures/families/
//! gemma3-270m-oracle.json`, made by `tools/hf_gemma_oracle.py`), on eight prompts:
//!
//! * reference backend: top-1 equal, every top-10 probability within 0.005, the greedy
//!   continuation equal to HF's for 16 tokens, and every hidden state of one prompt at
//!   cosine ≥ 0.9999;
//! * CPU fast path: top-1 equal on every prompt, every prompt's top-10 |Δp| within 0.03 or no
//!   further from HF than llama.cpp is on it ([`LLAMA_CPP_DP`], measured on the same file), and
//!   over the eight prompts the mean and the largest |Δp| at most llama.cpp's. Both engines
//!   quantize activations to int8, and this model amplifies that noise on some prompts
//!   (" jumps" after "The quick brown fox": HF 0.416, llama.cpp 0.288). With one-level int8
//!   everywhere ours was 0.039 off on "def fibonacci(n):" (llama.cpp 0.003): f32 activations in
//!   every matmul remove the whole gap, no single layer, matmul class or position carries it,
//!   and two-level activations on the Q/K/V projections (`KernelSettings::two_level_qkv`, on by
//!   default) bring every prompt within 0.024 on this AVX-512 VNNI machine.
//! * CUDA backend (`--features cuda`, on the GPU machine): top-1 equal, each prompt's Δp within
//!   0.03 or no further than llama.cpp's, and HF's 16 greedy tokens.
//!
//! The model is fetched and cached through the hub by name, like the default model.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use damascus_kernels::settings::KernelSettings;
use damascus_model::verify::{Fixture, Tolerance, verify};
use damascus_model::{BackendKind, LoadOptions, Model};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families")
}

fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        damascus_hub::known_model_path("gemma3-270m")
            .expect("Gemma 3 270M could not be fetched (damascus pull gemma3-270m)")
    })
}

/// The model on `backend`, with the `DAMASCUS_*` kernel settings of the environment as the
/// CLI maps them (none set: the defaults), so a setting can be checked against HF here too.
fn load(backend: BackendKind) -> Model {
    let kernel = KernelSettings::from_vars(|k| std::env::var(k).ok()).expect("DAMASCUS_* settings");
    let opts = LoadOptions {
        n_ctx: Some(64),
        backend,
        kernel,
        ..Default::default()
    };
    Model::load(path(), &opts).expect("loading Gemma 3 270M")
}

struct Case {
    prompt: String,
    ids: Vec<u32>,
    /// HF's top-10 `(id, probability)` of the next token.
    top: Vec<(u32, f64)>,
    greedy: Vec<u32>,
    margin: f64,
}

fn cases() -> Vec<Case> {
    let path = dir().join("gemma3-270m-oracle.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap().to_string(),
            ids: ids(&c["ids"]),
            top: c["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
                .collect(),
            greedy: ids(&c["greedy_ids"]),
            margin: c["greedy_min_top2_margin"].as_f64().unwrap_or(0.0),
        })
        .collect()
}

/// llama.cpp's largest top-10 |Δp| from HF per prompt: the llama-cpp-python 0.3.36 vendor
/// tree, CPU (AVX2) build, `llama-server -m gemma-3-270m-q4_k_m.gguf`, `/completion` with the
/// prompt ids, `n_probs: 10`, `temperature: 0` (2026-12-06).
const LLAMA_CPP_DP: &[(&str, f64)] = &[
    ("The capital of France is", 0.0119),
    ("The quick brown fox", 0.1286),
    ("Once upon a time, there was a little", 0.0330),
    ("def fibonacci(n):", 0.0030),
    ("The three primary colors are", 0.0431),
    ("1, 2, 3, 4, 5,", 0.0075),
    ("東京は日本の", 0.0064),
    ("Water boils at a temperature of", 0.0279),
];

fn probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The largest |p − p_HF| over HF's top-10, after checking the top-1.
fn check_next(m: &Model, case: &Case, what: &str) -> f64 {
    let logits = m.session().unwrap().eval(&case.ids).unwrap();
    let p = probs(&logits);
    let top1 = (0..p.len()).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap() as u32;
    assert_eq!(top1, case.top[0].0, "{what} {:?}: top-1", case.prompt);
    case.top
        .iter()
        .map(|&(id, want)| (p[id as usize] - want).abs())
        .fold(0.0, f64::max)
}

#[test]
fn reference_matches_hf_on_every_prompt() {
    let m = load(BackendKind::Reference);
    for case in cases() {
        let d = check_next(&m, &case, "reference");
        assert!(d <= 0.005, "reference {:?}: top-10 Δp {d}", case.prompt);
    }
}

#[test]
fn reference_greedy_matches_hf_for_16_tokens() {
    let m = load(BackendKind::Reference);
    for case in cases().iter().take(3) {
        check_greedy(&m, case, "reference");
    }
}

/// HF's greedy continuation, a difference allowed only at an HF near-tie.
fn check_greedy(m: &Model, case: &Case, what: &str) {
    let mut s = m.session().unwrap();
    let mut next = s.eval_argmax(&case.ids).unwrap();
    let mut got = vec![next];
    while got.len() < case.greedy.len() {
        next = s.eval_argmax(&[next]).unwrap();
        got.push(next);
    }
    assert!(
        got == case.greedy || case.margin < 1e-3,
        "{what} {:?}: greedy {got:?}, HF {:?} (HF's smallest top-2 margin {})",
        case.prompt,
        case.greedy,
        case.margin
    );
}

#[test]
fn reference_hidden_states_match_hf() {
    let m = load(BackendKind::Reference);
    let fx = Fixture::load(dir().join("gemma3-270m-0.json")).unwrap();
    let r = verify(&m, &fx).unwrap();
    assert!(
        r.passed(&Tolerance::REFERENCE),
        "diverges at {:?} (min cosine {})",
        r.first_divergence(&Tolerance::REFERENCE).map(|s| &s.label),
        r.min_cosine()
    );
}

#[test]
fn fast_path_matches_hf_on_every_prompt() {
    let m = load(BackendKind::Cpu { n_threads: Some(2) });
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for case in cases() {
        let d = check_next(&m, &case, "cpu");
        let llama = LLAMA_CPP_DP
            .iter()
            .find(|(p, _)| *p == case.prompt)
            .map(|&(_, l)| l)
            .expect("a llama.cpp measurement for every prompt");
        eprintln!(
            "{:<40} Δp ours {d:.4}  llama.cpp {llama:.4}",
            format!("{:?}", case.prompt)
        );
        ours.push(d);
        theirs.push(llama);
    }
    // The comparison holds the default fast path of an int8 CPU (weights repacked): a forced
    // scalar ISA multiplies the file layout instead, and only the top-1 is checked there.
    if !m.load_note().unwrap_or_default().contains("repacked") {
        return;
    }
    for ((case, &d), &l) in cases().iter().zip(&ours).zip(&theirs) {
        assert!(
            d <= 0.03 || d <= l,
            "{:?}: top-10 Δp {d:.4} (llama.cpp {l:.4})",
            case.prompt
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    assert!(
        mean(&ours) <= mean(&theirs) && max(&ours) <= max(&theirs),
        "fast path further from HF than llama.cpp: mean Δp {:.4} vs {:.4}, max {:.4} vs {:.4}",
        mean(&ours),
        mean(&theirs),
        max(&ours),
        max(&theirs)
    );
}

/// The real Gemma 3 270M on the CUDA backend: top-1 equal on every prompt, each top-10 Δp
/// within 0.03 or no further than llama.cpp's on that prompt, and HF's greedy continuation for
/// 16 tokens on the first three prompts (a difference allowed only at an HF near-tie).
/// Without a device this says SKIPPED, unless `DAMASCUS_REQUIRE_CUDA=1` (the GPU machine).
#[cfg(feature = "cuda")]
#[test]
fn cuda_matches_hf() {
    if !common::cuda_device() {
        return;
    }
    let m = load(BackendKind::Cuda {
        device: 0,
        n_gpu_layers: None,
        n_threads: None,
    });
    let mut far = Vec::new();
    for case in cases() {
        let d = check_next(&m, &case, "cuda");
        let llama = LLAMA_CPP_DP
            .iter()
            .find(|(p, _)| *p == case.prompt)
            .map_or(0.0, |&(_, l)| l);
        eprintln!(
            "{:<40} Δp cuda {d:.4}  llama.cpp {llama:.4}",
            format!("{:?}", case.prompt)
        );
        if d > 0.03 && d > llama {
            far.push(format!(
                "{:?}: Δp {d:.4} (llama.cpp {llama:.4})",
                case.prompt
            ));
        }
    }
    assert!(
        far.is_empty(),
        "cuda further from HF than 0.03 and llama.cpp: {far:?}"
    );
    for case in cases().iter().take(3) {
        check_greedy(&m, case, "cuda");
    }
}
