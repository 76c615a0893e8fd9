//! Issue 29 B3: a prompt computed fresh and computed as a cached prefix plus a suffix give
//! bit-identical logits on the fast CPU path (and the reference), whatever the split: the
//! kernel route of a row must not depend on how many rows share its matmul, and every token
//! attends through the same kernel. The default model on the CPU backend (f16 and q8_0
//! caches); the synthetic `tiny-llama3` on the (slow) reference.

mod common;

use std::sync::Arc;

use damascus_gguf::GgufFile;
use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::reference::ReferenceBackend;
use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_quant::recipe::Mix;

fn file() -> Arc<GgufFile> {
    common::default_model_file()
}

fn opts() -> LoadOptions {
    LoadOptions {
        n_ctx: Some(96),
        ..Default::default()
    }
}

/// A 40-token prompt (ids of ordinary tokens).
fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| 1000 + (i * 37) % 500).collect()
}

/// Logits of the last token of `ids` fed in pieces of the given sizes.
fn logits_in_pieces(model: &Model, ids: &[u32], pieces: &[usize]) -> Vec<f32> {
    let mut s = model.session().unwrap();
    let mut at = 0;
    let mut out = Vec::new();
    for &n in pieces {
        out = s.eval(&ids[at..at + n]).unwrap();
        at += n;
    }
    assert_eq!(at, ids.len());
    out
}

fn check(model: &Model) {
    let ids = prompt();
    let fresh = logits_in_pieces(model, &ids, &[40]);
    // Cached prefix + suffix, at splits that cross the GEMM threshold both ways, and a prompt
    // fed one token at a time.
    for pieces in [
        &[32, 8][..],
        &[20, 20],
        &[3, 37],
        &[17, 1, 22],
        &[39, 1],
        &[1; 40],
    ] {
        let got = logits_in_pieces(model, &ids, pieces);
        let differ = got
            .iter()
            .zip(&fresh)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max = got
            .iter()
            .zip(&fresh)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // With AMX-BF16 prompts (the default on AMX hosts) prompts multiply on bf16 tiles and
        // decode on the VNNI GEMV, which round differently: there the greedy token must still
        // agree; everywhere else (AMX-INT8 tiles included) every bit.
        if model.backend_name() == "cpu-amx" {
            assert_eq!(
                damascus_model::backend::host_argmax(&got),
                damascus_model::backend::host_argmax(&fresh),
                "{}: pieces {pieces:?}: the greedy token differs (max |diff| {max})",
                model.backend_name()
            );
            continue;
        }
        assert_eq!(
            differ,
            0,
            "{}: pieces {pieces:?}: {differ} logits differ from the fresh prompt (max |diff| {max})",
            model.backend_name()
        );
    }
}

#[test]
fn cached_prefix_gives_the_fresh_logits_on_the_cpu_backend() {
    for threads in [1, 2] {
        check(&Model::with_backend(file(), &opts(), CpuBackend::new(Some(threads))).unwrap());
    }
}

#[test]
fn cached_prefix_gives_the_fresh_logits_on_the_reference() {
    let tiny = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    check(&Model::with_backend(tiny, &opts(), ReferenceBackend).unwrap());
}

#[test]
fn cached_prefix_gives_the_fresh_logits_on_a_q8_0_cache() {
    let opts = LoadOptions {
        cache_type: Some(KvCacheType::Q8_0),
        ..opts()
    };
    for threads in [1, 2] {
        check(&Model::with_backend(file(), &opts, CpuBackend::new(Some(threads))).unwrap());
    }
}
