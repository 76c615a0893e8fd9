//! Batch invariance on CUDA (issue 26): a greedy sequence gives the same tokens alone and
//! inside a batch of up to 17 sequences arriving and leaving, prompts chunked by a token
//! budget, over one shared paged KV pool with prefix reuse (the server's continuous
//! batching), on the synthetic `tiny-llama3` (also over a q8_0 pool), the tiny family fixtures
//! (Gemma 3's sliding windows and Phi-3's included) and the default model where it is cached.
//!
//! Bits are not promised at this level: a pass of 16 rows or more multiplies through cuBLAS
//! in bf16 and a shorter one through the dp4a GEMVs, so a row's logits depend on how many
//! rows share its pass (the attention kernels themselves give a row the bits it gets alone:
//! `crates/cuda/tests/attention.rs`). So each step's logits must agree within the fast path's
//! tolerance (cosine ≥ 0.999) and the greedy tokens must agree, unless the two candidates are
//! closer than the logits' measured disagreement (a near-tie; the sequences are then compared
//! no further).
//!
//! The server's step itself (`PagedCache::forward_picks`: device argmax for greedy rows, the
//! logits of the others) is checked against the logits of the same pass.
//!
//! Runs with `--features cuda`. Without a device every test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine).
#![cfg(feature = "cuda")]

mod common;

use common::sim::{seq, simulate};

use std::path::Path;
use std::sync::Arc;

use damascus_gguf::GgufFile;
use damascus_model::backend::cuda::CudaBackend;
use damascus_model::backend::host_argmax;
use damascus_model::batch::{PagedCache, SeqInput, StepOut};
use damascus_model::{BackendKind, LoadOptions, Model};
use damascus_quant::recipe::Mix;

/// The server's block size.
const BLOCK: usize = 16;
const N_BLOCKS: usize = 128;
const MIN_COSINE: f64 = 0.999;

/// `n` token ids below `n_vocab` (past the first few, often special).
fn prompt(seed: u32, n: usize, n_vocab: usize) -> Vec<u32> {
    let span = (n_vocab as u32).saturating_sub(8).clamp(1, 5000);
    (0..n as u32)
        .map(|i| 4 + (seed * 7919 + i * 104_729) % span)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(f64::MIN_POSITIVE)
}

/// Alone and batched logits of one sequence agree step by step (see the module docs).
fn assert_same_tokens(alone: &[Vec<f32>], batched: &[Vec<f32>], what: &str) {
    assert_eq!(alone.len(), batched.len(), "{what}: steps");
    for (step, (a, b)) in alone.iter().zip(batched).enumerate() {
        let c = cosine(a, b);
        assert!(c >= MIN_COSINE, "{what}: step {step}: logits cosine {c}");
        let (ta, tb) = (host_argmax(a) as usize, host_argmax(b) as usize);
        if ta != tb {
            let err = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let margin = a[ta] - a[tb];
            assert!(
                margin <= 2.0 * err,
                "{what}: step {step}: greedy token {ta} alone, {tb} batched (margin {margin}, \
                 largest logit difference {err})"
            );
            eprintln!("{what}: step {step}: near-tie {ta}/{tb} (margin {margin}), stopping");
            return;
        }
    }
}

/// The target alone, then among 16 (or `others`) sequences arriving and leaving around it —
/// two sharing its first 8 tokens (prefix reuse), one with its whole prompt as a prefix —
/// with prompt chunks under `budget` tokens per step.
fn check(model: &Model, others: u32, budget: usize, what: &str) {
    let n_vocab = model.params().n_vocab;
    let target = prompt(1, 21, n_vocab);
    let alone = simulate(
        model,
        vec![seq(0, target.clone(), 6)],
        budget,
        N_BLOCKS,
        BLOCK,
    );
    let mut seqs = vec![seq(2, target.clone(), 6)];
    for i in 0..others {
        let mut p = prompt(10 + i, 3 + (i as usize * 5) % 29, n_vocab);
        if i < 2 {
            p.splice(0..0, target[..8].iter().copied());
        }
        seqs.push(seq(i as usize / 2, p, 2 + (i as usize % 5)));
    }
    let mut extended = target.clone();
    extended.extend(prompt(99, 5, n_vocab));
    seqs.push(seq(9, extended, 3));
    let batched = simulate(model, seqs, budget, N_BLOCKS, BLOCK);
    assert_same_tokens(&alone[0], &batched[0], what);
}

fn cuda_model(file: Arc<GgufFile>) -> Model {
    let b = CudaBackend::new(0).expect("opening the CUDA backend");
    let opts = LoadOptions {
        n_ctx: Some(256),
        ..Default::default()
    };
    Model::with_backend(file, &opts, b).expect("loading on CUDA")
}

#[test]
fn tiny_llama3_gives_the_same_tokens_alone_and_batched() {
    if !common::cuda_device() {
        return;
    }
    for (mix, label) in [(Mix::Q4_K_M, "Q4_K_M"), (Mix::Q8_0, "Q8_0")] {
        let m = cuda_model(common::tiny(mix, label));
        assert!(m.supports_batches());
        // Passes under 16 rows (every matmul on the GEMVs), then the CPU test's shape (passes
        // of up to 24 rows: cuBLAS and GEMVs mixed).
        check(&m, 10, 15, &format!("tiny-llama3 {label}, budget 15"));
        check(&m, 15, 24, &format!("tiny-llama3 {label}, budget 24"));
    }
}

#[test]
fn q8_0_pool_gives_the_same_tokens_alone_and_batched() {
    // `--cache-type q8_0`: the shared pool and the lone sequence's cache both quantize each
    // row as it is written, so a row's cache bytes do not depend on the batch either.
    if !common::cuda_device() {
        return;
    }
    let b = CudaBackend::new(0).expect("opening the CUDA backend");
    let opts = LoadOptions {
        n_ctx: Some(256),
        cache_type: Some(damascus_model::KvCacheType::Q8_0),
        ..Default::default()
    };
    let m = Model::with_backend(common::tiny(Mix::Q4_K_M, "Q4_K_M"), &opts, b).unwrap();
    check(&m, 10, 15, "tiny-llama3 Q4_K_M q8_0, budget 15");
    check(&m, 15, 24, "tiny-llama3 Q4_K_M q8_0, budget 24");
}

#[test]
fn family_fixtures_give_the_same_tokens_alone_and_batched() {
    if !common::cuda_device() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families");
    for family in ["qwen2", "qwen3", "phi3", "mistral", "gemma3"] {
        let f = GgufFile::open(dir.join(format!("{family}.gguf")))
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        let m = cuda_model(Arc::new(f));
        check(&m, 15, 24, family);
    }
}

#[test]
fn default_model_gives_the_same_tokens_alone_and_batched() {
    if !common::cuda_device() {
        return;
    }
    // Where it is already cached (the GPU machine has no internet).
    let cached = damascus_hub::cache_dir()
        .map(|d| d.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .ok()
        .filter(|p| p.exists());
    let Some(p) = cached else {
        eprintln!("SKIPPED: the default model is not cached here");
        return;
    };
    let m = cuda_model(Arc::new(GgufFile::open(p).unwrap()));
    check(&m, 15, 24, "SmolLM2 Q4_1, budget 24");
    check(&m, 10, 15, "SmolLM2 Q4_1, budget 15");
}

#[test]
fn layer_split_batches_too() {
    // `--ngl 1` on the two-layer tiny-llama3: embeddings, layer 0 and the LM head on the CPU,
    // layer 1 on the GPU, both sides over their own layers of the shared pool.
    if !common::cuda_device() {
        return;
    }
    let opts = LoadOptions {
        n_ctx: Some(256),
        backend: BackendKind::Cuda {
            device: 0,
            n_gpu_layers: Some(1),
            n_threads: Some(2),
        },
        ..Default::default()
    };
    let m = Model::from_file(common::tiny(Mix::Q4_K_M, "Q4_K_M"), &opts).unwrap();
    assert!(m.supports_batches(), "{}", m.backend_name());
    check(&m, 15, 24, "tiny-llama3 Q4_K_M, --ngl 1");
}

#[test]
fn device_picks_match_the_logits_of_the_same_pass() {
    // `PagedCache::forward_picks` (the server's step): greedy sequences get the device argmax,
    // the others their logits (gathered on the device, only those rows read back). Against
    // `forward` on a twin cache: the same pass, so the same logits up to cuBLAS's run-to-run
    // determinism, and the picks their argmax (unless a near-tie).
    if !common::cuda_device() {
        return;
    }
    let m = cuda_model(common::tiny(Mix::Q4_K_M, "Q4_K_M"));
    let n_vocab = m.config().n_vocab as usize;
    // 4 sequences, 18 rows (cuBLAS) and then one decode row each (the GEMVs).
    let prompts: Vec<Vec<u32>> = [5usize, 1, 9, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(i as u32 + 1, n, n_vocab))
        .collect();
    let tables: Vec<Vec<u32>> = (0..4u32).map(|i| (4 * i..4 * i + 4).collect()).collect();
    for greedy in [[true; 4], [true, false, true, false], [false; 4]] {
        let mut plain: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        let mut picks: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        let mut all = prompts.clone();
        let mut n_past = [0usize; 4];
        for step in 0..3 {
            let inputs: Vec<SeqInput<'_>> = (0..4)
                .map(|i| SeqInput {
                    ids: &all[i][n_past[i]..],
                    pos0: n_past[i],
                    table: &tables[i],
                    logits: true,
                })
                .collect();
            let want = plain.forward(&inputs).unwrap();
            let got = picks.forward_picks(&inputs, &greedy).unwrap();
            drop(inputs);
            for (i, (w, g)) in want.iter().zip(got).enumerate() {
                let what = format!("step {step} sequence {i} greedy {greedy:?}");
                let best = host_argmax(w);
                match g {
                    StepOut::Token(t) => {
                        assert!(greedy[i], "{what}: a pick for a sampled row");
                        let gap = w[best as usize] - w[t as usize];
                        assert!(t == best || gap < 1e-3, "{what}: pick {t} vs argmax {best}");
                    }
                    StepOut::Logits(l) => {
                        assert!(!greedy[i], "{what}: logits for a greedy row");
                        assert!(cosine(w, &l) >= 0.99999, "{what}: logits differ");
                    }
                }
                n_past[i] = all[i].len();
                all[i].push(best);
            }
        }
    }
}
