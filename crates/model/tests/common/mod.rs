//! Test helpers shared by the backend tests: synthetic models generated once per machine.
#![allow(dead_code)]

pub mod sim;

use std::path::PathBuf;
use std::sync::Arc;

use damascus_convert::{NoProgress, Shape, SynthOptions, synth_model};
use damascus_gguf::GgufFile;
use damascus_quant::recipe::Mix;

/// A path in the shared scratch directory for generated test models.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("damascus-test-models");
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir.join(name)
}

/// `tiny-llama3` in `mix`, generated once per machine.
pub fn tiny(mix: Mix, label: &str) -> Arc<GgufFile> {
    // One generator per process (tests run on threads); a per-process temporary name keeps
    // concurrent test binaries from writing the same file.
    static GEN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = GEN.lock().unwrap_or_else(|p| p.into_inner());
    let path = scratch(&format!("tiny-llama3.{label}.gguf"));
    if !path.exists() {
        let tokenizer =
            damascus_hub::llama3_tokenizer_json().expect("fetching the Llama 3 tokenizer");
        let opts = SynthOptions {
            shape: Shape::by_name("tiny-llama3").expect("tiny-llama3 shape"),
            mix,
            seed: damascus_convert::DEFAULT_SEED,
            tokenizer: &tokenizer,
            threads: damascus_convert::default_threads(),
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        synth_model(&opts, &tmp, &NoProgress).expect("synthesizing");
        std::fs::rename(&tmp, &path).expect("moving the model into place");
    }
    Arc::new(GgufFile::open(&path).expect("opening the synthetic model"))
}

/// Whether a CUDA device is present. Without one this says SKIPPED and returns false, unless
/// `DAMASCUS_REQUIRE_CUDA=1` (the GPU machine), where it fails.
#[cfg(feature = "cuda")]
pub fn cuda_device() -> bool {
    use damascus_model::ModelError;
    let required = std::env::var("DAMASCUS_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    match damascus_model::backend::cuda::CudaBackend::new(0) {
        Err(ModelError::Cuda(damascus_cuda::CudaError::NoDevice(why))) => {
            assert!(!required, "no CUDA device: {why}");
            eprintln!("SKIPPED: no CUDA device ({why})");
            false
        }
        _ => true,
    }
}

/// The default model (SmolLM2-135M-Instruct Q4_1), fetched and opened once per process.
pub fn default_model_file() -> Arc<GgufFile> {
    static FILE: std::sync::OnceLock<Arc<GgufFile>> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = damascus_hub::default_model_path()
            .expect("the default model (SmolLM2-135M-Instruct Q4_1) could not be fetched");
        Arc::new(GgufFile::open(path).expect("opening the default model"))
    })
    .clone()
}

/// Deterministic pseudo-random values in about [-1, 1).
pub fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `[n_tokens, width]` of [`vals`].
pub fn act(
    n_tokens: usize,
    width: usize,
    seed: u64,
) -> damascus_model::backend::reference::HostAct {
    damascus_model::backend::reference::HostAct {
        n_tokens,
        width,
        data: vals(n_tokens * width, seed),
    }
}

/// The fast path's bar against the reference: the logits' cosine.
pub const MIN_LOGITS_COSINE: f64 = 0.999;
/// The fast path's bar against the reference: every hidden slot's cosine.
pub const MIN_HIDDEN_COSINE: f64 = 0.995;

/// `d` (a backend against the reference on one prompt) within the fast path's bars: every
/// hidden slot, the logits, and the same top-1.
pub fn assert_near_reference(d: &damascus_model::verify::BackendDiff, what: &str) {
    for s in &d.slots {
        assert!(
            s.cosine >= MIN_HIDDEN_COSINE,
            "{what}: {} cosine {}",
            s.label,
            s.cosine
        );
    }
    eprintln!("{what}: logits cosine {:.6}", d.logits_cosine);
    assert!(
        d.logits_cosine >= MIN_LOGITS_COSINE,
        "{what}: logits cosine {}",
        d.logits_cosine
    );
    assert!(d.same_top1, "{what}: top-1 differs");
}
